"""A broker that restarts without its log (the embedded one keeps it in memory), on the in-memory bus.

The producer resends its window of acknowledged batches to the new incarnation, the materializer
drops its stored offsets and rereads from 0, and batch keys drop the repeats. When the window
no longer holds what was lost, the loss is counted (heartbeats, ``status``).
"""

import threading
import time

import duckdb
import pytest

from rankstream.consumers.materializer import Materializer
from tests.doubles import MemorySource, MemoryTransport
from rankstream.consumers.store import Store
from rankstream.producers.producer import Producer
from rankstream.schemas import all_topics
from rankstream.status import RUNS_SQL


@pytest.fixture
def store(tmp_path):
    return Store(duckdb.connect(str(tmp_path / "t.duckdb")))


class LiveMaterializer:
    """The real materializer loop on a thread, reading the memory bus."""

    def __init__(self, config, bus, store, pause: threading.Event | None = None):
        self.materializer = Materializer(config, store, MemorySource(bus, all_topics(config.topic_prefix)),
                                         log=lambda line: self.lines.append(line))
        self.lines: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.materializer.run, args=(self.stop,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def emit(producer, start, count):
    for i in range(start, start + count):
        producer.emit("op", ts_ns=i, dur_ns=1, step=i // 100)
    assert producer.flush(5.0)


def stored_events(store, run_id="job"):
    return store.cursor().execute("SELECT count(*), count(DISTINCT ts_ns) FROM trace_events WHERE run_id = ?",
                                  [run_id]).fetchone()


def run_status(store) -> dict:
    """The run's row of ``rankstream status``."""
    cursor = store.cursor().execute(RUNS_SQL)
    return dict(zip([column[0] for column in cursor.description], cursor.fetchone()))


def wait_for(condition, timeout_s=15.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_restart_loses_nothing_when_the_window_holds_the_unconsumed_backlog(make_config, bus, store):
    config = make_config(**{"producer.batch_events": 100, "producer.broker_check_s": 0.05})
    producer = Producer(run_id="job", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
    with LiveMaterializer(config, bus, store) as live:
        emit(producer, 0, 1_000)
        assert wait_for(lambda: stored_events(store)[0] == 1_000)
        live.stop.set()  # the materializer falls behind: 1,000 more events wait on the broker only
        live.thread.join(10)
    emit(producer, 1_000, 1_000)
    bus.restart()
    emit(producer, 2_000, 1_000)
    assert wait_for(lambda: producer.stats().broker_resets == 1)
    stats = producer.close()
    with LiveMaterializer(config, bus, store) as live:
        assert wait_for(lambda: stored_events(store) == (3_000, 3_000))
        assert any("broker restarted" in line for line in live.lines)
        assert live.materializer.status.broker_resets == 1
    assert stats.events_sent == 3_000 and stats.events_resent >= 2_000 and stats.events_not_resent == 0
    keys = store.cursor().execute("SELECT count(*), count(DISTINCT (stream, session_id, seq)) "
                                  "FROM ingested_batches").fetchone()
    assert keys[0] == keys[1]
    run = run_status(store)
    assert (run["broker_resets"], run["not_resent"], run["missing_messages"]) == (1, 0, 0)


def test_a_restart_noticed_while_consuming_rereads_the_new_log_from_its_start(make_config, bus, store):
    config = make_config(**{"producer.batch_events": 100})
    with LiveMaterializer(config, bus, store) as live:
        first = Producer(run_id="job", rank=0, world_size=2, config=config, transport=MemoryTransport(bus))
        emit(first, 0, 3_000)
        first.close()
        assert wait_for(lambda: stored_events(store)[0] == 3_000)
        bus.restart()
        # A rank that starts now writes the new log from offset 0, below the materializer's stored
        # offsets; read from there, its first batches would be skipped.
        second = Producer(run_id="job", rank=1, world_size=2, config=config, transport=MemoryTransport(bus))
        emit(second, 10_000, 3_000)
        second.close()
        assert wait_for(lambda: live.materializer.status.broker_resets == 1)
        assert wait_for(lambda: stored_events(store) == (6_000, 6_000))


def test_loss_beyond_the_window_is_counted_in_heartbeats_and_status(make_config, bus, store):
    config = make_config(**{"producer.batch_events": 100, "producer.broker_check_s": 0.05,
                            "producer.resend_window_bytes": 1})  # the window keeps only the newest batch
    producer = Producer(run_id="job", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
    emit(producer, 0, 1_000)  # never consumed before the restart
    bus.restart()
    emit(producer, 1_000, 500)
    assert wait_for(lambda: producer.stats().broker_resets == 1)
    stats = producer.close()
    with LiveMaterializer(config, bus, store):
        assert wait_for(lambda: store.cursor().execute(
            "SELECT count(*) FROM heartbeats WHERE final").fetchone()[0] == 1)
    stored, _ = stored_events(store)
    assert 500 <= stored < 1_500
    assert 1_500 - stored <= stats.events_not_resent
    run = run_status(store)
    assert run["not_resent"] == stats.events_not_resent > 0
    assert run["missing_messages"] > 0  # the lost batches are sequence gaps


class UnreachableSource(MemorySource):
    """A source whose broker never answers."""

    def open(self, offsets):
        from rankstream.schemas.errors import BrokerUnavailable

        raise BrokerUnavailable("broker at 127.0.0.1:1 did not answer")


def test_a_materializer_that_cannot_open_says_why_in_its_status_file(tmp_path, store):
    """``rankstream status`` reads the status file; before this, a materializer that never managed
    to open wrote none (it only wrote while consuming), so its status was just missing."""
    import json

    from rankstream.schemas.settings import load_config
    from rankstream.consumers.materializer import status_path
    from tests.doubles import MemoryBus

    config = load_config({"state_dir": tmp_path / "state", "topic_prefix": "down"}, env={})
    source = UnreachableSource(MemoryBus(partitions=1), all_topics("down"))
    stop = threading.Event()
    thread = threading.Thread(target=Materializer(config, store, source, log=lambda line: None).run,
                              args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not status_path(config).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    written_while_retrying = status_path(config).exists()  # it also writes one when it stops
    stop.set()
    thread.join(10)
    assert written_while_retrying
    status = json.loads(status_path(config).read_text())
    assert "did not answer" in status["last_error"] and status["events"] == 0
