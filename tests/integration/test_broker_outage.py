"""A producer whose broker disappears keeps training unblocked and delivers when a broker returns."""

import threading
import time

import duckdb
import pytest

from rankstream.services import materialize
from rankstream.deploy.broker import stop_broker
from rankstream.services import start_embedded_broker
from rankstream.producers.producer import Producer

from .conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timed]


def emit_steps(producer, label, steps, per_step=1_000):
    """Emit like a training loop; return the slowest single emit call in seconds."""
    slowest = 0.0
    for step in range(steps):
        for i in range(per_step):
            started = time.perf_counter()
            producer.emit(label, "cpu_op", "X", ts_ns=time.time_ns(), dur_ns=10, pid=1, tid=1, step=step)
            slowest = max(slowest, time.perf_counter() - started)
    return slowest


def test_outage_keeps_the_caller_unblocked_and_delivers_after_return(make_config):
    config = make_config(broker_port=free_port(), partitions=2,
                         **{"producer.batch_events": 500, "producer.max_inflight_bytes": 256 << 10})
    start_embedded_broker(config)
    producer = Producer(run_id="outage", rank=0, world_size=1, config=config)
    emit_steps(producer, "before", steps=5)
    assert producer.flush(timeout_s=10)
    assert producer.stats().events_sent == 5_000

    stop_broker(config)
    slowest = emit_steps(producer, "during", steps=20)
    deadline = time.monotonic() + 30
    while producer.stats().broker != "down" and time.monotonic() < deadline:
        time.sleep(0.05)
    during = producer.stats()
    assert during.broker == "down"
    assert slowest < 0.05, f"an emit call took {slowest * 1000:.1f} ms during the outage"

    start_embedded_broker(config)  # a new, empty broker on the same port
    deadline = time.monotonic() + 60
    while producer.stats().events_sent < 25_000 and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = producer.close()
    try:
        assert stats.events_dropped == 0
        assert stats.events_sent >= 25_000
        materialize(config, threading.Event(), once=True, log=lambda line: None)
        con = duckdb.connect(str(config.db_path), read_only=True)
        during_rows = con.execute("SELECT count(*) FROM trace_events WHERE name = 'during'").fetchone()[0]
        con.close()
        # The embedded broker keeps its log in memory, so 'before' died with the first broker;
        # every event emitted during the outage reached the new one.
        assert during_rows == 20_000
    finally:
        stop_broker(config)
