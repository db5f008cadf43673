"""A burst of producer processes (simulated ranks) at full rate against the real broker and a real
materializer process, on this machine's cores: lag grows and ``status`` reports it, every producer's
memory stays within its caps, and after the burst everything accepted is stored, exactly once.

16 ranks for 4 s by default; ``--long``: 64 ranks for 10 s (``bench/soak.py`` prints the figures).
"""

import json
import multiprocessing
import resource
import time

import pytest

from rankstream.schemas.settings import load_config
from rankstream.consumers.query import connect
from rankstream.services import down, up

from ..conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timed]  # a burst that saturates the cores: alone

CAPS = {"producer.max_buffered_events": 20_000, "producer.max_inflight_bytes": 4 << 20,
        "producer.resend_window_bytes": 4 << 20}
#: What the caps allow a producer to hold (rows of ~11 Python objects, encoded bytes twice over)
#: plus the interpreter's own churn; an unbounded queue at these rates would pass it in a second.
GROWTH_BOUND_MB = 120


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def burst_rank(rank: int, world: int, seconds: float, config, go, results) -> None:
    from rankstream.producers.producer import Producer

    before = _rss_mb()
    producer = Producer(run_id="burst", rank=rank, world_size=world, config=config)
    go.wait(120)
    deadline, step = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        for index in range(1000):
            producer.emit("burst_op", "cpu_op", "X", ts_ns=time.time_ns(), dur_ns=1000, pid=rank, tid=1, step=step,
                          flow_id=None, correlation_id=index)
        step += 1
    stats = producer.close(timeout_s=120)
    results.put({"accepted": stats.events_emitted, "dropped": stats.events_dropped,
                 "spool_bytes": stats.spool_bytes, "growth_mb": _rss_mb() - before})


def test_a_burst_of_ranks_lags_reports_it_stays_bounded_and_catches_up(tmp_path, long_mode):
    ranks, seconds = (64, 10.0) if long_mode else (16, 4.0)
    config = load_config({"db_path": tmp_path / "burst.duckdb", "state_dir": tmp_path / "state",
                          "broker_port": free_port(), "partitions": 8, **CAPS}, env={})
    up(config)
    context = multiprocessing.get_context("spawn")  # this test process has threads: do not fork it
    go, results = context.Event(), context.Queue()
    children = [context.Process(target=burst_rank, args=(r, ranks, seconds, config, go, results))
                for r in range(ranks)]
    status_path = config.state_dir / "materializer.json"
    try:
        for child in children:
            child.start()
        time.sleep(2.0 + 0.6 * ranks)  # interpreters starting on two cores
        go.set()
        lags, reports = [], []
        while len(reports) < ranks:
            try:
                lags.append(json.loads(status_path.read_text()).get("lag_messages") or 0)
            except (OSError, ValueError):
                pass
            while not results.empty():
                reports.append(results.get())
            time.sleep(0.5)
        for child in children:
            child.join(30)
        accepted = sum(r["accepted"] for r in reports)
        database = connect(config.db_path)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            stored = database.fetchall("SELECT count(*) FROM trace_events WHERE run_id = 'burst'")[0][0]
            if stored >= accepted:
                break
            time.sleep(1.0)
        repeats = database.fetchall("SELECT count(*) - count(DISTINCT (rank, stream, session_id, seq)) "
                                    "FROM ingested_batches WHERE run_id = 'burst'")[0][0]
    finally:
        down(config)
    assert max(lags) > 0, lags  # the materializer fell behind, and said so
    assert all(r["spool_bytes"] == 0 for r in reports)  # close() delivered everything it had
    assert stored == accepted > 0 and repeats == 0
    assert sum(r["dropped"] for r in reports) > 0  # full rate outruns two cores: the caps held, and counted
    assert max(r["growth_mb"] for r in reports) < GROWTH_BOUND_MB, [round(r["growth_mb"]) for r in reports]
