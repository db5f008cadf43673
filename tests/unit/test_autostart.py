"""The pieces of ``rankstream run`` that need no job: the bootstrap, step marks, windows, run ids,
the endpoint ``up`` records, and the command line that passes the job's own options through."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rankstream.autostart import IterationMarks
from rankstream.cli.app import hoist_global_options
from rankstream.launcher import BOOTSTRAP_DIR, new_run_id, pace
from rankstream.producers.profiler import periodic_windows
from rankstream.producers.session import resolve_identity
from rankstream.schemas.settings import (
    forget_endpoint,
    launch_environment,
    load_config,
    record_endpoint,
)


def _marks(order):
    marked = []
    hook = IterationMarks(lambda: marked.append(len(marked)))
    for optimizer in order:
        hook(optimizer)
    return len(marked)


def test_one_mark_per_iteration_whatever_the_number_of_optimizers():
    a, b, c = object(), object(), object()
    assert _marks([a] * 5) == 5
    assert _marks([a, b] * 4) == 4
    assert _marks([a, b, a, b, c, b, c, b]) == 4  # a replaced by c from the third iteration on
    # a GAN: its critic steps twice (or five times) per generator step; in the first iteration,
    # before the generator first stepped, each critic step counts (it cannot be told from a lone one)
    assert _marks([a, a, b] * 20) == 2 + 19
    assert _marks([a] * 5 + [b] + ([a] * 5 + [b]) * 9) == 5 + 9
    assert _marks([a] * 3 + [b] * 40) == 3 + 40 - IterationMarks.RECENT_CALLS  # b replaced a: alone once a is stale


def test_the_status_line_names_a_slowest_rank_only_when_it_stands_out():
    # a synchronous job: every rank steps at the slowest one's pace, a few microseconds apart
    assert pace({0: 27.51, 1: 27.49, 2: 27.52, 3: 27.50}) == ", 27.5 ms/step, ranks even"
    assert pace({0: 20.0, 1: 20.5, 2: 31.0, 3: 19.8}) == ", slowest rank 2 (31.0 ms/step, the others 20.0)"
    assert pace({0: 20.0, 1: 23.0}) == ", slowest rank 1 (23.0 ms/step, the others 20.0)"  # 2 ranks: 10% is 10%
    assert pace({0: 20.0, 1: None}) == ", 20.0 ms/step"
    assert pace({0: None, 1: None}) == ""


def test_windows_come_after_ten_steps_then_every_n():
    from torch.profiler import ProfilerAction as A

    action = periodic_windows(every=5, active=2)
    actions = [action(step) for step in range(20)]
    assert actions[:9] == [A.NONE] * 9
    assert actions[9:14] == [A.WARMUP, A.RECORD, A.RECORD_AND_SAVE, A.NONE, A.NONE]
    assert actions[14:19] == actions[9:14]
    with pytest.raises(ValueError):
        periodic_windows(every=3, active=2)


def test_global_options_after_double_dash_belong_to_the_job():
    argv = ["run", "--db", "x.duckdb", "--", "torchrun", "train.py", "--db", "theirs"]
    assert hoist_global_options(argv) == ["--db", "x.duckdb", "run", "--", "torchrun", "train.py", "--db", "theirs"]


def test_every_launch_gets_a_new_readable_run_id():
    first, second = (new_run_id(["torchrun", "--nproc-per-node", "2", "path/to/train.py"]) for _ in range(2))
    assert first != second and first.startswith("train-")
    assert new_run_id(["srun", "python"]).startswith("srun-")


def _python(code: str, pythonpath: list, **extra) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath)), **extra}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_the_bootstrap_chains_to_the_sitecustomize_it_hides_and_imports_nothing_heavy(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("print('the other sitecustomize ran')\n")
    output = _python("import sys; print(sorted(m for m in ('torch', 'rankstream.api', 'duckdb', 'rankstream.autostart')"
                     " if m in sys.modules))", [BOOTSTRAP_DIR, tmp_path])
    assert "the other sitecustomize ran" in output
    assert "['rankstream.autostart']" in output


def test_the_bootstrap_wraps_init_process_group_once_torch_defines_it():
    output = _python("import torch.distributed as d, torch.distributed.distributed_c10d as c;"
                     "print(d.init_process_group.__rankstream__, c.init_process_group is d.init_process_group)",
                     [BOOTSTRAP_DIR])
    assert "True True" in output


def test_the_endpoint_up_recorded_is_used_unless_something_explicit_says_otherwise(tmp_path):
    state = tmp_path / "state"
    chosen = load_config({"state_dir": state, "broker_port": 29555, "db_path": tmp_path / "mine.duckdb"}, env={})
    record_endpoint(chosen)
    later = load_config({"state_dir": state}, env={})
    assert (later.broker_port, later.db_path) == (29555, (tmp_path / "mine.duckdb").resolve())
    assert load_config({"state_dir": state}, env={"RANKSTREAM_BROKER_PORT": "29600"}).broker_port == 29600
    forget_endpoint(chosen)
    assert load_config({"state_dir": state}, env={}).broker_port == 29092


def test_launcher_job_ids_and_the_agent_store_are_read_from_the_environment():
    slurm = launch_environment({"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "3", "RANK": "1", "WORLD_SIZE": "2"})
    assert resolve_identity(None, None, None, launch=slurm) == ("job-slurm-12.3", 1, 2)
    assert launch_environment({"TORCHELASTIC_USE_AGENT_STORE": "True"}).agent_store
    plain = launch_environment({"MASTER_ADDR": "h", "MASTER_PORT": "1"})
    first, _, _ = resolve_identity(None, 0, 1, launch=plain)
    assert first == resolve_identity(None, 1, 1, launch=plain)[0]  # the ranks of one launch agree
    assert first.startswith(f"job-h-1-{os.getppid()}.")  # the process that launched this one


def test_the_id_run_proposes_wins_over_torchruns_random_rendezvous_id():
    """``torchrun --nproc-per-node 2`` without a port makes a random rendezvous id; under ``run``
    the ranks take run's proposal (through the store), so run finds them under the id it printed."""
    torchrun = {"TORCHELASTIC_RUN_ID": "3f1c-uuid", "RANK": "0", "WORLD_SIZE": "1"}
    assert resolve_identity(None, None, None, launch=launch_environment(torchrun))[0] == "3f1c-uuid"
    proposed = launch_environment({**torchrun, "RANKSTREAM_RUN_PROPOSAL": "train-1"})
    assert resolve_identity(None, None, None, launch=proposed)[0] == "train-1"
    chosen = launch_environment({**torchrun, "RANKSTREAM_RUN_PROPOSAL": "train-1", "RANKSTREAM_RUN_ID": "mine"})
    assert resolve_identity(None, None, None, launch=chosen)[0] == "mine"


def test_run_follows_the_id_its_ranks_agreed_on(tmp_path):
    from rankstream.autostart import _tell_the_launcher
    from rankstream.launcher import JobOptions, _Watch

    said = []
    watch = _Watch(load_config({"state_dir": tmp_path}, env={}), "proposed", tmp_path / "run", JobOptions(["x"]),
                   said.append)
    watch.follow_agreed_id()
    assert watch.run_id == "proposed" and not said  # no rank wrote yet
    _tell_the_launcher(tmp_path / "run", "node0-proposal")
    watch.follow_agreed_id()
    assert watch.run_id == "node0-proposal" and "node0-proposal" in said[0]


def test_run_says_when_a_live_finding_it_printed_clears_and_again_if_it_returns(tmp_path, monkeypatch):
    """A 14 s checkpoint pause was printed as a skipped collective and never taken back."""
    import rankstream.status
    from rankstream.launcher import JobOptions, _Watch

    pause = {"kind": "skipped_collective", "pg_name": "0", "seq": 9, "culprit_ranks": [0],
             "detail": "rank 0 never reached all_reduce #9"}
    open_now = [[pause], [pause], [], [pause]]
    monkeypatch.setattr(rankstream.status, "live_findings", lambda database, run_id: open_now.pop(0))
    said = []
    watch = _Watch(load_config({"state_dir": tmp_path}, env={}), "run", tmp_path / "run", JobOptions(["x"]),
                   said.append)
    watch.database = object()  # the findings come from the stand-in above
    assert [watch._new_findings() for _ in range(4)] == [True, False, False, True]
    assert said == ["rankstream: SKIPPED_COLLECTIVE: rank 0 never reached all_reduce #9 (culprit rank 0)",
                    "rankstream: cleared, the ranks moved on: rank 0 never reached all_reduce #9",
                    "rankstream: SKIPPED_COLLECTIVE: rank 0 never reached all_reduce #9 (culprit rank 0)"]


def test_a_producer_aimed_away_from_the_broker_up_recorded_is_told(tmp_path):
    from rankstream.schemas.settings import endpoint_mismatch

    state = tmp_path / "state"
    record_endpoint(load_config({"state_dir": state, "broker_port": 29555}, env={}))
    assert endpoint_mismatch(load_config({"state_dir": state}, env={})) is None
    elsewhere = load_config({"state_dir": state}, env={"RANKSTREAM_BROKER_PORT": "29092"})
    assert "serves 127.0.0.1:29555" in endpoint_mismatch(elsewhere)


def test_the_status_line_says_when_the_materializer_stopped_reporting(make_config):
    """A stopped or stuck materializer leaves its last status file behind: its lag is not shown as
    current (probe 12: "ingest lag 0 messages" for 300 s while nothing was stored)."""
    import json
    import time

    from rankstream.consumers.materializer import status_path
    from rankstream.launcher import _ingest_lag

    config = make_config()
    config.state_dir.mkdir(parents=True)
    status_path(config).write_text(json.dumps({"updated_at": time.time(), "lag_messages": 3}))
    assert _ingest_lag(config) == ", ingest lag 3 messages"
    status_path(config).write_text(json.dumps({"updated_at": time.time() - 60, "lag_messages": 0}))
    assert _ingest_lag(config).startswith(", the materializer has not reported for 60 s (stopped or stuck: ")
    status_path(config).unlink()
    assert _ingest_lag(config) == ""


def test_an_exception_of_several_lines_keeps_its_first_and_last():
    from rankstream.producers.session import exception_text

    caught = ValueError("Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
                        '  File "train.py", line 12, in __getitem__\nValueError: corrupted record 1302\n')
    assert exception_text(caught) == ("Caught ValueError in DataLoader worker process 0. ... "
                                      "ValueError: corrupted record 1302")
    assert exception_text(ValueError("bad batch")) == "bad batch"
    assert exception_text(ValueError()) == ""
