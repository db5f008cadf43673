"""What the materializer puts in one transaction (``Materializer._gather``): DuckDB stores a big
insert far more cheaply than many small ones, but a slow stream must not wait for company."""

import threading
import time

import pytest

from tests.doubles import MemoryBus, MemorySource
from rankstream.consumers import materializer as materializer_module
from rankstream.consumers.materializer import Materializer, _Committer
from rankstream.schemas import all_topics
from rankstream.schemas.codec import encode_wire
from rankstream.schemas.envelope import PayloadKind, Stream
from rankstream.schemas.topics import message_key, topic_for
from rankstream.schemas.trace import TraceBatch


class _Store:
    """Commits nothing; while ``hold`` is clear a commit waits for it."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.hold.set()

    def commit(self, batch):
        self.hold.wait(10)


@pytest.fixture
def setup(make_config):
    config = make_config()
    bus = MemoryBus()
    source = MemorySource(bus, all_topics(config.topic_prefix))
    source.open({})
    materializer = Materializer(config, store=None, source=source, announce=lambda raw: None)
    store = _Store()
    committer = _Committer(store, on_commit=lambda batch, result: None)
    sequence = iter(range(10**6))

    def publish(count: int = 1) -> int:
        """Trace messages of 1,000 events each; returns one message's size in bytes."""
        for _ in range(count):
            rows = [("op", "cpu_op", "X", i, 1, 0, 0, None, None, None, None) for i in range(1000)]
            value = encode_wire(run_id="job", rank=0, world_size=1, session_id="s", seq=next(sequence),
                                kind=PayloadKind.TRACE_BATCH, wire_payload=TraceBatch.from_rows(rows).to_wire())
            bus.append(topic_for(config.topic_prefix, Stream.TRACE), message_key("job", 0), value)
        return len(value)

    yield materializer, committer, store, publish
    store.hold.set()
    committer.close()


def _later(seconds: float, action) -> None:
    threading.Timer(seconds, action).start()


def test_records_that_arrive_while_the_last_batch_waits_for_the_committer_go_into_the_next_one(setup):
    materializer, committer, store, publish = setup
    store.hold.clear()
    committer.submit("a poll")  # taken at once, then committing until released
    committer.submit("the next poll")  # waits for the committer
    publish()
    _later(0.2, publish)
    _later(0.4, store.hold.set)
    assert len(materializer._gather(committer)) == 2


def test_a_fast_stream_is_gathered_until_it_fills_the_target(setup, monkeypatch):
    materializer, committer, _, publish = setup
    size = publish(2)
    monkeypatch.setattr(materializer_module, "_TARGET_TRACE_BYTES", 8 * size)  # 2 messages: a quarter
    monkeypatch.setattr(materializer_module, "_HOLD_S", 20.0)
    _later(0.2, lambda: publish(6))
    started = time.monotonic()
    assert len(materializer._gather(committer)) == 8
    assert time.monotonic() - started < 10  # handed over once full, not at the end of the hold


def test_a_slow_stream_is_handed_over_at_once(setup, monkeypatch):
    materializer, committer, _, publish = setup
    size = publish(1)
    monkeypatch.setattr(materializer_module, "_TARGET_TRACE_BYTES", 64 * size)  # 1 message: under an eighth
    monkeypatch.setattr(materializer_module, "_HOLD_S", 20.0)
    started = time.monotonic()
    assert len(materializer._gather(committer)) == 1
    assert time.monotonic() - started < 10
