"""Collective diagnosis of real gloo jobs with injected faults, on the data they streamed."""

import time
import uuid

import pytest

from rankstream.schemas.settings import config_env
from rankstream.consumers.query import connect
from rankstream.demo.job import JobSpec, start_job
from rankstream.flows.diagnose import analyze_stored

from .conftest import free_port

pytestmark = pytest.mark.integration


def run_job(live, tmp_path, **overrides):
    settings = dict(run_id=f"d-{uuid.uuid4().hex[:8]}", world_size=4, steps=6, master_port=free_port(),
                    report_dir=str(tmp_path), collective_timeout_s=8)
    settings.update(overrides)
    spec = JobSpec(**settings)
    for process in start_job(spec, config_env(live)):
        process.join(120)
    database = connect(live.db_path)
    deadline = time.monotonic() + 20  # the final FR snapshot comes before each rank's final heartbeat
    while time.monotonic() < deadline and database.fetchall(
            "SELECT count(DISTINCT rank) FROM heartbeats WHERE run_id = ? AND final", [spec.run_id])[0][0] < spec.world_size:
        time.sleep(0.25)  # (a killed rank never sends one: then the deadline ends the wait)
    last, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < 2:  # until the stream is drained
        count = database.fetchall("SELECT count(*) FROM fr_entries WHERE run_id = ?", [spec.run_id])[0][0]
        if count != last:
            last, stable_since = count, time.monotonic()
        time.sleep(0.25)
    return analyze_stored(live.db_path, spec.run_id)


#: Default-group sequence number of the middle step's all-reduce (steps 0-2 all-reduce, a broadcast
#: at step 0, then step 3).
MIDDLE_ALLREDUCE = 5


@pytest.mark.parametrize("fault,kinds", [
    ("wrong_op", {"type_mismatch"}),
    ("extra", {"extra_collective", "type_mismatch"}),
    # gloo aborts the process on a wrong-size all-reduce before anything records it: what is left
    # is that rank 1 never got as far as its peers
    ("desync", {"size_mismatch", "missing_rank", "hang"}),
    # rank 1 skips the all-reduce, then blocks in its next collective on another group: on the
    # default group it is simply behind its peers, who wait in that all-reduce
    ("hang", {"hang", "skipped_collective"}),
])
def test_faults_name_kind_group_sequence_and_culprit(live, tmp_path, fault, kinds):
    report = run_job(live, tmp_path, fault=fault, fault_rank=1)
    first = report.findings[0]
    assert report.verdict in ("desync", "hang")
    assert first.kind in kinds and first.culprit_ranks == [1]
    if fault != "desync":  # an aborted rank's last published entries stop in whichever group it was in
        assert first.group_desc == "default_pg" and first.seq == MIDDLE_ALLREDUCE


def test_a_slow_rank_is_the_straggler(live, tmp_path):
    report = run_job(live, tmp_path, fault="straggler", fault_rank=3, steps=14, straggler_sleep_s=0.1)
    stragglers = [f for f in report.findings if f.kind == "straggler"]
    # shown if it fails (CI once found no straggler at all): what was found, and what each rank's
    # Flight Recorder gave the analysis (only collectives every member logged are compared)
    entries = connect(live.db_path).fetchall(
        "SELECT rank, count(*), count(DISTINCT collective_seq_id), max(collective_seq_id) FROM fr_entries "
        "WHERE run_id = ? GROUP BY rank ORDER BY rank", [report.run_id])
    assert stragglers and stragglers[0].culprit_ranks == [3], (
        [(f.kind, f.culprit_ranks, f.detail) for f in report.findings], entries)
    assert report.verdict == "straggler"


def test_a_killed_rank_is_the_culprit_of_the_hang(live, tmp_path):
    report = run_job(live, tmp_path, fault="crash", fault_rank=2)
    hangs = [f for f in report.findings if f.kind == "hang"]
    assert hangs and hangs[0].culprit_ranks == [2] and hangs[0].group_desc == "default_pg"
