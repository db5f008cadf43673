"""Real gloo jobs with one rank at fault: the culprit is named from the ranks' own Flight Recorder
dumps (``rankstream diagnose``), from the run stored in DuckDB, and live by the hang watch within
10 s of the fault, while the job is still hung."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from rankstream.consumers.query import connect
from rankstream.demo.job import JobSpec, read_reports, start_job
from rankstream.flows.collective_analysis import diagnose_run
from rankstream.schemas.settings import config_env

from .conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timed]

#: How long a rank waits in a collective before gloo gives up (then every rank dumps its ring).
TIMEOUT_S = 14
#: How long four spawned ranks may take to import torch and meet, on a loaded machine.
STARTUP_S = 60


def _run(live, tmp_path, fault: str, fault_rank: int, *, fault_step: int | None = None):
    # a job that goes on after the fault runs long enough for the watch to see it while it runs
    spec = JobSpec(run_id=f"g-{fault}-{uuid.uuid4().hex[:6]}", world_size=4, steps=40 if fault == "size" else 6,
                   fault=fault, fault_step=fault_step,
                   fault_rank=fault_rank, master_port=free_port(), report_dir=str(tmp_path),
                   collective_timeout_s=TIMEOUT_S, dump_flight_recorder=True)
    processes = start_job(spec, config_env(live))
    database = connect(live.db_path)
    # the latency is judged from the fault's own time below: this only bounds the wait, start-up included
    episode, deadline = None, time.monotonic() + STARTUP_S + TIMEOUT_S + 20
    while episode is None and time.monotonic() < deadline:
        rows = database.arrow("SELECT * FROM live_findings WHERE run_id = ? ORDER BY first_seen_ns",
                              [spec.run_id]).to_pylist()
        episode = rows[0] if rows else None
        time.sleep(0.25)
    hung = all(p.is_alive() for p in processes if p.name != f"rank{fault_rank}" or fault not in ("crash", "desync"))
    for process in processes:
        process.join(TIMEOUT_S + 60)
    return spec, episode, hung


#: fault -> the root-cause kinds that fit what gloo's recorder shows. gloo blocks a rank inside the
#: call it issued, so a rank stuck in an extra call shows nothing after it: from the dumps alone
#: that is a collective of the wrong type at that sequence number.
CASES = {
    "hang": {"skipped_collective"},          # skips the gradient all-reduce, goes on to the next step
    "extra": {"extra_collective", "type_mismatch"},
    "wrong_op": {"type_mismatch"},           # broadcasts where its peers all-reduce
    "size": {"size_mismatch"},               # an all-gather of another shape in its two-rank group (it completes)
    "desync": {"missing_dump"},              # all-reduces half its gradients: gloo aborts it
    "cross_group": {"skipped_collective"},   # its partner waits in the pair, everyone else for the partner
    "crash": {"missing_dump"},               # SIGKILL: no dump, peers wait for it
}
#: Live, a rank that died is a dead rank; gloo's tap may have published the aborted all-reduce first.
LIVE = {"crash": {"dead_rank"}, "desync": {"dead_rank", "size_mismatch"}}
#: Faults after which the job does not hang: it goes on (size), or gloo fails every peer of a rank
#: that died at once (crash, desync).
NO_HANG = {"size", "crash", "desync"}


@pytest.mark.parametrize("fault", sorted(CASES))
def test_the_culprit_is_named_from_dumps_stored_data_and_live(live, tmp_path, fault):
    culprit = 3 if fault == "cross_group" else 1
    spec, episode, hung = _run(live, tmp_path, fault, culprit)
    fault_at_ns = read_reports(spec.report_dir)[culprit]["fault_at_ns"]

    # live: one root cause, the right rank, within 10 s, while the others were still hung
    assert episode is not None, "the hang watch found nothing"
    assert hung or fault in NO_HANG, "the finding must come while the job is hung"
    assert episode["kind"] in LIVE.get(fault, CASES[fault]) and episode["culprit_ranks"] == [culprit], episode
    assert (episode["first_seen_ns"] - fault_at_ns) / 1e9 <= 10

    # the dumps every rank wrote when its collective timed out (the killed rank wrote none)
    done = subprocess.run([sys.executable, "-m", "rankstream", "diagnose", str(tmp_path / "dumps"), "-p", "rank_",
                           "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr + done.stdout
    report = json.loads(done.stdout)
    root = report["findings"][0]
    assert root["kind"] in CASES[fault] and root["culprit_ranks"] == [culprit], report["root_cause"]
    assert report["root_cause"].startswith(f"root cause: rank {culprit} ")

    # the same run as stored through the bus: the same culprit
    stored, _ = diagnose_run(live.db_path, spec.run_id)
    assert stored.findings[0].culprit_ranks == [culprit], stored.root_cause


def test_a_rank_that_skips_its_pair_s_very_first_call_is_named(live, tmp_path):
    """The pair (2, 3) is created after ``init_process_group``; rank 3 skips its first call, so
    only rank 2 ever records an entry of it. gloo's dumps list no groups: the stored run knows the
    pair's members only from the groups torch lists, reported with the ranks' dumps (it named rank
    2's peers in the world group when the pair's members were read from its entries alone)."""
    spec, episode, _ = _run(live, tmp_path, "cross_group", 3, fault_step=0)
    assert episode is not None and episode["culprit_ranks"] == [3], episode
    stored, _ = diagnose_run(live.db_path, spec.run_id)
    assert (stored.findings[0].kind, stored.findings[0].culprit_ranks) == ("skipped_collective", [3]), stored.root_cause
