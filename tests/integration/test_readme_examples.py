"""Every example of the README, run as written: the training script under torchrun (2 gloo ranks)
on the real broker, then each `rankstream` command and the Python query, against what it streamed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rankstream.schemas.settings import config_env
from rankstream.services import materialize

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import kineto_gpu_generator  # noqa: E402

from .conftest import cli, free_port

pytestmark = pytest.mark.integration

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)
PYTHON = [body for lang, body in BLOCKS if lang == "python"]
SHELL_LINES = [line.split("#")[0].strip() for lang, body in BLOCKS if lang == "" for line in body.splitlines()]
#: The commands run against the streamed run (starting and stopping services is the fixtures' job).
QUERIES = [line for line in SHELL_LINES if line.startswith("rankstream ") and line.split()[1] in
           ("status", "report", "timeline", "sql", "analyze")]


@pytest.fixture(scope="module")
def streamed(tmp_path_factory, broker_port):
    """The README's training script, run as the README says, then materialized."""
    from rankstream.schemas.settings import load_config

    root = tmp_path_factory.mktemp("readme")
    config = load_config({"db_path": root / "rankstream.duckdb", "state_dir": root / "state",
                          "broker_port": broker_port, "topic_prefix": f"readme{os.getpid()}"}, env={})
    script = next(body for body in PYTHON if body.startswith("# train.py"))
    (root / "train.py").write_text(script)
    launch = next(line for line in SHELL_LINES if "torchrun" in line and not line.startswith("rankstream run"))
    variables, command = launch.split(" torchrun ")[0], "torchrun " + launch.split(" torchrun ")[1]
    env = {**os.environ, **config_env(config), **dict(v.split("=") for v in variables.split())}
    argv = [sys.executable, "-m", "torch.distributed.run", f"--master-port={free_port()}", *shlex.split(command)[1:]]
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    materialize(config, threading.Event(), once=True, log=lambda line: None)
    # the GPU example's trace files: real Kineto exports are not on every machine, generated ones are
    kineto_gpu_generator.generate(root, ranks=2, steps=3, kernels_per_step=40, seed=1, compress=True)
    return config, root


def test_the_training_example_streams_its_steps_spans_and_collectives(streamed):
    config, _ = streamed
    rows = cli(config, "sql", "--json", "SELECT count(DISTINCT rank), count(*) FILTER (WHERE name = 'forward'), "
               "(SELECT count(*) FROM fr_entries WHERE run_id = 'first-run') FROM spans WHERE run_id = 'first-run'")
    ranks, forwards, entries = [list(r.values()) for r in __import__("json").loads(rows.stdout)][0]
    assert ranks == 2 and forwards == 12 and entries > 0


@pytest.mark.parametrize("command", QUERIES)
def test_each_command_runs_as_written(streamed, command):
    config, root = streamed
    done = cli(config, *shlex.split(command)[1:], cwd=root, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stdout.strip()


def test_the_python_query_runs_as_written(streamed):
    config, root = streamed
    example = next(body for body in PYTHON if "rankstream.connect" in body)
    done = subprocess.run([sys.executable, "-c", example], cwd=root, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **config_env(config)})
    assert done.returncode == 0, done.stderr
    assert "forward" in done.stdout
