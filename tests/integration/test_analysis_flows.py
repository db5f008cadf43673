"""The analysis flows on real data: a 4-rank gloo job streamed through the real broker into the
live materializer (analyses run through its query server), Prefect's test harness, and the
schedules of ``rankstream serve`` on a real local Prefect server."""

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import duckdb
import pytest

from rankstream.schemas.settings import config_env, load_config
from rankstream.consumers.query import connect
from rankstream.demo.job import JobSpec, start_job
from rankstream.flows.chrome_trace import check_chrome_trace

from ..unit.run_builder import build_run
from .conftest import free_port

pytestmark = pytest.mark.integration


def wait_drained(database, run_id: str, world_size: int = 4) -> None:
    deadline = time.monotonic() + 20  # the final FR snapshot comes before each rank's final heartbeat
    while time.monotonic() < deadline and database.fetchall(
            "SELECT count(DISTINCT rank) FROM heartbeats WHERE run_id = ? AND final", [run_id])[0][0] < world_size:
        time.sleep(0.25)
    last, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < 2:
        count = database.fetchall("SELECT count(*) FROM trace_events WHERE run_id = ?", [run_id])[0][0]
        if count != last:
            last, stable_since = count, time.monotonic()
        time.sleep(0.25)


@pytest.fixture(scope="module")
def straggler_run(live, tmp_path_factory):
    """A 4-rank gloo job in which rank 2 sleeps before every step."""
    spec = JobSpec(run_id=f"a-{uuid.uuid4().hex[:8]}", world_size=4, steps=14, fault="straggler", fault_rank=2,
                   # 0.2 s: 4 ranks share 2 cores, and on a loaded CI machine another rank was slowest in
                   # 5 of 14 steps with 0.1 s
                   straggler_sleep_s=0.2, master_port=free_port(),
                   report_dir=str(tmp_path_factory.mktemp("reports")))
    for process in start_job(spec, config_env(live)):
        process.join(180)
    wait_drained(connect(live.db_path), spec.run_id)
    return spec


def test_the_slow_rank_ranks_first_and_the_run_merges_and_draws(live, straggler_run, prefect_harness, tmp_path):
    from rankstream.flows.prefect_flows import run_analyses

    run = straggler_run.run_id
    out = run_analyses(str(live.db_path), run, str(tmp_path))  # through the live materializer's server
    database = connect(live.db_path)
    ranking = database.fetchall("SELECT rank FROM rank_slowness WHERE run_id = ? ORDER BY ranking", [run])
    assert [r for (r,) in ranking][0] == straggler_run.fault_rank
    steps = database.fetchall("SELECT count(*) FROM step_trace WHERE run_id = ? AND slowest_order = 1 AND rank = ?",
                              [run, straggler_run.fault_rank])[0][0]
    assert steps >= straggler_run.steps * 0.7
    # one host, one clock: every rank reads the reference rank's (same_host, 0), and the barrier estimate
    # kept beside it must contain 0 too
    sync_failures = database.fetchall(  # shown if it fails: why a rank has no barrier estimate
        "SELECT rank, args FROM trace_events WHERE run_id = ? AND name = 'clock_sync_failed'", [run])
    samples = database.fetchall("SELECT rank, clock_round, clock_error_ns FROM rank_metadata WHERE run_id = ? "
                                "AND clock_sync_ns IS NOT NULL ORDER BY rank", [run])
    offsets = database.fetchall(
        "SELECT rank, source, offset_ns, error_ns, chosen FROM clock_offsets WHERE run_id = ? "
        "AND source IN ('same_host', 'barrier')", [run])
    chosen = sorted((rank, source, offset, error) for rank, source, offset, error, is_chosen in offsets if is_chosen)
    assert chosen == [(rank, "same_host", 0, 0) for rank in range(4)], offsets
    barrier = [(rank, offset, error) for rank, source, offset, error, _ in offsets if source == "barrier"]
    assert len(barrier) == 4, (offsets, sync_failures, samples)
    for rank, offset, error in barrier:
        assert abs(offset) <= error, (rank, offset, error, sync_failures, samples)
    # the communication matrix adds up to the Flight Recorder entries
    matrix, entries = database.fetchall("""
        SELECT (SELECT sum(bytes) FROM comm_matrix WHERE run_id = $1 AND kind = 'collective'),
               (SELECT sum(tensor_bytes(input_sizes, input_dtypes))::DOUBLE FROM fr_entries_latest WHERE run_id = $1)""",
                                        [run])[0]
    assert matrix == pytest.approx(entries)
    (path,) = out["timeline"]
    problems, summary = check_chrome_trace(path)
    assert problems == [] and summary["pids"] == [0, 1, 2, 3]
    # lateness below twice the largest clock error is not reported: shown if it fails
    assert out["collectives"]["verdict"] == "straggler", (out["collectives"], offsets)


def test_timeline_cli_splits_and_the_checker_accepts_it(live, straggler_run, tmp_path):
    from .conftest import cli

    result = cli(live, "timeline", "--run", straggler_run.run_id, "-o", str(tmp_path / "t.json"), "--max-events", "1000")
    files = re.findall(r"wrote (\S+)", result.stdout)
    assert len(files) > 1 and "split into" in result.stdout
    checked = cli(live, "check-trace", *files)
    assert checked.stdout.count(": ok,") == len(files)
    report = cli(live, "report", "--run", straggler_run.run_id, "--json")
    data = __import__("json").loads(report.stdout)
    assert data["slowest"][0]["rank"] == straggler_run.fault_rank


def _interruptible() -> None:
    """Ctrl-C for the child even when the tests run in the background: a shell starts background
    commands with SIGINT ignored, the child inherits that, and Python then installs no handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_serve_runs_the_end_of_run_trigger_on_a_real_prefect_server(tmp_path):
    db = tmp_path / "served.duckdb"
    build_run(db, run_id="ended", finished=True)
    build_run(db, run_id="running", finished=False)
    with duckdb.connect(str(db)) as con:  # heard from ahead of now: it stays live for the whole test
        con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final) "
                    "VALUES ('running', 0, 's0', $1, false)", [time.time_ns() + 600 * 10**9])
    prefect_file = tmp_path / "prefect.yaml"
    prefect_file.write_text("deployments:\n  - name: end-of-run\n    entrypoint: flows/prefect_flows.py:end_of_run\n"
                            "    schedules:\n      - interval: 2\n")
    config = load_config({"db_path": db, "state_dir": tmp_path / "state"}, env={})
    env = {k: v for k, v in {**os.environ, **config_env(config)}.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "client-home")
    log = tmp_path / "serve.log"  # a file, not a pipe: serve logs every flow run, and a full pipe blocks it
    with open(log, "w") as sink:
        process = subprocess.Popen([sys.executable, "-m", "rankstream", "serve", "--prefect-file", str(prefect_file)],
                                   env=env, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT, text=True,
                                   preexec_fn=_interruptible)
    done = []
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not done:
            time.sleep(3)
            done = connect(db, wait_s=60).fetchall("SELECT run_id FROM analyses_done WHERE analysis = 'end_of_run'")
            assert process.poll() is None, log.read_text()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)
    output = log.read_text()
    url = re.search(r"against (http://\S+):", output)
    assert done == [("ended",)], output[-3000:]  # the run still going was left alone
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM step_trace WHERE run_id = 'ended'").fetchall()[0][0] > 0
    assert con.execute("SELECT count(*) FROM step_trace WHERE run_id = 'running'").fetchall()[0][0] == 0
    con.close()
    assert url, output
    with pytest.raises(OSError):  # the server rankstream started is gone with it
        urllib.request.urlopen(url.group(1) + "/health", timeout=2)
