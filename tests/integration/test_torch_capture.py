"""Real torch.distributed (gloo) jobs streamed through the real broker into DuckDB."""

import contextlib
import json
import time
import uuid

import pytest

from rankstream.schemas.settings import config_env
from rankstream.consumers.query import connect
from rankstream.demo.job import JobSpec, read_reports, start_job
from rankstream.producers.fr_reader import parse_dump
from rankstream.producers.fr_reader import entry_from_dump

from .conftest import free_port

pytestmark = pytest.mark.integration


def job(live, tmp_path, **overrides) -> JobSpec:
    settings = dict(run_id=f"t-{uuid.uuid4().hex[:8]}", world_size=2, steps=6, master_port=free_port(),
                    report_dir=str(tmp_path))
    settings.update(overrides)
    return JobSpec(**settings)


def run(spec, live, timeout_s=180):
    processes = start_job(spec, config_env(live))
    for process in processes:
        process.join(timeout_s)
    return [p.exitcode for p in processes]


def stored_events(database, run_id, rank=None, settle_s=1.5, timeout_s=60):
    """Trace events of a run (or a rank) once the count has stopped growing."""
    sql = "SELECT count(*) FROM trace_events WHERE run_id = ?" + (" AND rank = ?" if rank is not None else "")
    params = [run_id] + ([rank] if rank is not None else [])
    last, stable_since, deadline = -1, time.monotonic(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        count = database.fetchall(sql, params)[0][0]
        if count != last:
            last, stable_since = count, time.monotonic()
        elif time.monotonic() - stable_since > settle_s:
            return count
        time.sleep(0.2)
    return last


def test_every_rank_streams_events_and_fr_entries_matching_torchs_dump(live, tmp_path):
    spec = job(live, tmp_path, dump_flight_recorder=True)
    assert run(spec, live) == [0, 0]
    database = connect(live.db_path)
    reports = read_reports(spec.report_dir)
    for rank in (0, 1):
        assert stored_events(database, spec.run_id, rank) >= reports[rank]["events_emitted"] > 0
        steps = database.fetchall("SELECT min(step), max(step) FROM trace_events WHERE run_id = ? AND rank = ? "
                                  "AND name = 'step'", [spec.run_id, rank])
        assert steps == [(0, spec.steps - 1)]
        dump = parse_dump((tmp_path / f"rank{rank}.fr").read_bytes(), "dump")
        expected = sorted((e["record_id"], e["profiling_name"], e["collective_seq_id"], e["pg_name"], e["pg_desc"])
                          for e in map(entry_from_dump, dump["entries"]))
        stored = sorted(database.fetchall(
            "SELECT record_id, profiling_name, collective_seq_id, pg_name, pg_desc FROM fr_entries_latest "
            "WHERE run_id = ? AND rank = ?", [spec.run_id, rank]))
        assert stored == expected and len(expected) >= spec.steps * 2
    profiled = database.fetchall("SELECT count(*) FROM trace_events WHERE run_id = ? AND cat = 'cpu_op' "
                                 "AND step IS NOT NULL", [spec.run_id])[0][0]
    assert profiled > 0
    clock = database.fetchall("SELECT count(clock_sync_ns), max(clock_error_ns) FROM ranks WHERE run_id = ?",
                              [spec.run_id])[0]
    assert clock[0] == 2 and 0 < clock[1] < 5_000_000_000


def test_a_crashed_ranks_earlier_events_survive(live, tmp_path):
    spec = job(live, tmp_path, fault="crash", fault_rank=1, collective_timeout_s=20)
    codes = run(spec, live)
    assert codes[1] == -9  # SIGKILL
    database = connect(live.db_path)
    emitted_before = read_reports(spec.report_dir)[1]["emitted_1s_before_kill"]
    assert stored_events(database, spec.run_id, rank=1) >= emitted_before > 0


@contextlib.contextmanager
def running_job(live, tmp_path, **overrides):
    """A job started in the background (``(spec, processes, database)``), killed at the end."""
    spec = job(live, tmp_path, **overrides)
    processes = start_job(spec, config_env(live))
    try:
        yield spec, processes, connect(live.db_path)
    finally:
        for process in processes:
            process.kill()
            process.join()


@pytest.mark.timed
def test_a_hung_ranks_entries_appear_while_it_is_hung(live, tmp_path):
    with running_job(live, tmp_path, fault="hang", fault_rank=1, steps=6, collective_timeout_s=60) as (
            spec, processes, database):
        deadline = time.monotonic() + 45
        seen = None
        while time.monotonic() < deadline:
            rows = dict(database.fetchall(
                "SELECT rank, max(collective_seq_id) FROM fr_entries WHERE run_id = ? AND pg_desc = 'default_pg' "
                "GROUP BY rank", [spec.run_id]))
            # rank 1 skipped the all-reduce of step 3, so rank 0 waits in a collective rank 1 never issued
            if len(rows) == 2 and rows[0] > rows[1]:
                seen = rows
                break
            time.sleep(0.25)
        assert seen is not None, "the waiting rank's pending collective never showed up"
        assert all(p.is_alive() for p in processes), "the job should still be hung"
        beats = database.fetchall("SELECT rank, count(*) FROM heartbeats WHERE run_id = ? GROUP BY rank "
                                  "ORDER BY rank", [spec.run_id])
        assert [r for r, _ in beats] == [0, 1]


@pytest.mark.timed
def test_live_finding_for_a_rank_stuck_outside_collectives(live, tmp_path):
    """Rank 2 stops before the gradient all-reduce (a stuck data loader): its peers wait in it. The
    watch names rank 2 within 10 s while the job is still hung, with the stack rank 2 published."""
    with running_job(live, tmp_path, fault="stall", fault_rank=2, world_size=4, steps=6, collective_timeout_s=60) as (
            spec, processes, database):
        deadline, found = time.monotonic() + 40, None
        while time.monotonic() < deadline and found is None:
            rows = database.arrow("SELECT * FROM live_findings WHERE run_id = ?", [spec.run_id]).to_pylist()
            found = rows[0] if rows else None
            time.sleep(0.5)
        assert found is not None, "no live finding"
        assert all(p.is_alive() for p in processes), "the finding must come while the job is still hung"
        fault_at_ns = read_reports(spec.report_dir)[2]["fault_at_ns"]
        assert (found["first_seen_ns"] - fault_at_ns) / 1e9 <= 10
        assert (found["kind"], found["culprit_ranks"], found["waiting_ranks"]) == ("skipped_collective", [2], [0, 1, 3])
        assert any(frame["name"] == "train_rank" for frame in json.loads(found["stack"]))  # where the rank is
