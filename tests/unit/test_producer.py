"""The producer's promises to the training thread, against the in-memory bus."""

import gc
import json
import threading
import time

import pytest

from rankstream.producers.producer import Producer
from rankstream.schemas.errors import MessageRefused
from rankstream.schemas.trace import TraceBatch
from tests.doubles import MemorySource, MemoryTransport
from rankstream.schemas import Envelope, PayloadKind, all_topics, decode


def read_all(bus, prefix):
    source = MemorySource(bus, all_topics(prefix))
    source.open({})
    envelopes = []
    while records := source.poll(0, 10_000):
        envelopes += [decode(r.value) for r in records]
    assert all(isinstance(e, Envelope) for e in envelopes)
    return envelopes


def trace_events(envelopes):
    return sum(e.payload.count for e in envelopes if e.kind is PayloadKind.TRACE_BATCH)


class SlowConnect(MemoryTransport):
    """Connecting takes seconds, as with an unreachable bootstrap server (or until ``gate`` opens)."""

    def __init__(self, bus, delay_s):
        super().__init__(bus)
        self.delay_s = delay_s
        self.connect_threads = []
        self.gate, self.connected = threading.Event(), threading.Event()

    def connect(self):
        self.connect_threads.append(threading.current_thread().name)
        self.gate.wait(self.delay_s)
        self.connected.set()
        return super().connect()


def test_construction_and_emit_never_wait_for_the_broker(make_config, bus):
    transport = SlowConnect(bus, delay_s=60.0)  # connects only once the gate opens
    producer = Producer(run_id="r", rank=0, world_size=1, config=make_config(), transport=transport)
    for i in range(10_000):
        producer.emit("op", "cpu_op", "X", ts_ns=i, dur_ns=1)
    assert not transport.connected.is_set(), "construction and emits returned only once connected"
    assert all(name.startswith("rankstream-sender") for name in transport.connect_threads)
    transport.gate.set()
    stats = producer.close(timeout_s=5)
    assert stats.events_sent == 10_000


def test_every_event_arrives_exactly_once_with_gapless_sequences(make_config, bus):
    config = make_config(**{"producer.batch_events": 100})
    producer = Producer(run_id="r", rank=2, world_size=4, config=config, transport=MemoryTransport(bus))
    for i in range(1_050):
        producer.emit("op", ts_ns=i, step=i // 100)
    stats = producer.close()
    envelopes = read_all(bus, config.topic_prefix)
    assert trace_events(envelopes) == 1_050 == stats.events_sent
    for stream in {e.stream for e in envelopes}:
        seqs = sorted(e.seq for e in envelopes if e.stream is stream)
        assert seqs == list(range(len(seqs)))
    batches = [e.payload.count for e in envelopes if e.kind is PayloadKind.TRACE_BATCH]
    assert max(batches) == 100
    heartbeat = [e for e in envelopes if e.kind is PayloadKind.HEARTBEAT][-1].payload.fields
    assert heartbeat["final"] and heartbeat["events_emitted"] == 1_050


def test_emit_survives_any_arguments(make_config, bus):
    producer = Producer(run_id="r", rank=0, world_size=1, config=make_config(), transport=MemoryTransport(bus))
    producer.emit(["unhashable"], None, 3, ts_ns="not-a-time", dur_ns=float("nan"), step=2**80, args=object())
    producer.emit("fine", ts_ns=5)
    producer.emit_fr_entries([{"not": "an fr entry"}])
    producer.emit_rank_metadata(metadata={"x": float("inf")})
    stats = producer.close()
    assert stats.events_sent + stats.events_dropped == 2


def test_a_control_message_that_cannot_be_encoded_is_named_in_the_last_error(make_config, bus):
    # It used to vanish without a word: `status` had nothing to show.
    producer = Producer(run_id="r", rank=0, world_size=1, config=make_config(), transport=MemoryTransport(bus))
    producer.emit_fr_entries([object()])
    stats = producer.close()
    assert stats.last_error.startswith("a FR_BATCH message dropped: TypeError")


def test_one_bad_event_is_dropped_alone_counted_and_named(make_config, bus):
    """An event whose values do not fit its columns used to take its whole batch with it (or was
    stored with NULLs and numbers parsed from text): now only it is dropped, and the reason is kept."""
    config = make_config(**{"producer.batch_events": 100})
    producer = Producer(run_id="r", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
    for i in range(100):
        producer.emit("op", ts_ns=i, dur_ns=1)
        if i == 40:
            producer.emit("bad pid", ts_ns=i, pid=2**63)
        if i == 60:
            producer.emit("text step", ts_ns=i, step="7")
        if i == 80:
            producer.emit("far future", ts_ns=2**63 - 1)
    stats = producer.close()
    names = [name for e in read_all(bus, config.topic_prefix) if e.kind is PayloadKind.TRACE_BATCH
             for name in [e.payload.string_column("name")[1][c] for c in e.payload.string_column("name")[0]]]
    assert names == ["op"] * 100
    assert stats.events_dropped == 3 and stats.events_sent == 100
    assert "far future" in stats.last_error and "'ts_ns'" in stats.last_error


def test_args_arrive_as_strict_json_whatever_their_values(make_config, bus):
    config = make_config()
    producer = Producer(run_id="r", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
    odd = object()
    producer.emit("a", args={"nan": float("nan"), "inf": float("inf"), 3: "int key", "obj": odd})
    producer.emit("b", args={"big": 2**70, "text": "x"})
    producer.emit("c", args={"big": 2**70, "nan": float("nan")})
    producer.close()
    texts = [t for e in read_all(bus, config.topic_prefix) if e.kind is PayloadKind.TRACE_BATCH for t in e.payload.args]
    strict = [json.loads(t, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c} in {t}")) for t in texts]
    assert strict[0] == {"nan": None, "inf": None, "3": "int key", "obj": str(odd)}
    assert strict[1] == {"big": 2**70, "text": "x"}  # exact, beyond 64 bits
    assert list(strict[2]) == ["unserializable"]  # a 71-bit integer and a NaN: no exact strict JSON of both


def test_queued_events_with_args_never_reach_the_oldest_gc_generation(make_config, bus):
    """Rows waiting for the sender must not pile up in the GC's oldest generation: there they set
    off full collections, pauses of a few hundred ms on a torch-sized heap, on the training thread."""
    # Tracked rows would add at least one object per event; other threads of the test session add
    # a few thousand at most, so a quarter of the event count separates the two.
    events = 40_000
    config = make_config()
    transport = SlowConnect(bus, delay_s=60.0)  # the sender is stuck connecting: rows stay queued
    producer = Producer(run_id="r", rank=0, world_size=1, config=config, transport=transport)
    gc.collect()
    before = len(gc.get_objects(2))
    for i in range(events):
        producer.emit("metric", "user_counter", "C", ts_ns=i, args={"value": float(i), "name": "loss"})
    gc.collect(1)
    gc.collect(1)  # two young collections: anything still tracked is now in the oldest generation
    assert len(gc.get_objects(2)) - before < events // 4
    assert not transport.connected.is_set(), "the rows were measured while still queued"
    transport.gate.set()
    producer.close(timeout_s=10)
    batches = [e.payload for e in read_all(bus, config.topic_prefix) if e.kind is PayloadKind.TRACE_BATCH]
    args = [json.loads(text) for batch in batches for text in batch.args]
    assert len(args) == events and args[7] == {"value": 7.0, "name": "loss"}


def test_args_nested_too_deep_to_encode_keep_their_event_and_the_sender_thread(make_config, bus):
    # The encoder's RecursionError escaped the sender thread, which stopped: every later event lost.
    config = make_config(**{"producer.batch_events": 10})
    producer = Producer(run_id="r", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
    deep = 1
    for _ in range(5000):
        deep = {"a": deep}
    producer.emit("deep", ts_ns=1, args={"k": deep})
    for i in range(25):
        producer.emit("after", ts_ns=2 + i, args={"i": i})
    stats = producer.close()
    batches = [e.payload for e in read_all(bus, config.topic_prefix) if e.kind is PayloadKind.TRACE_BATCH]
    texts = [json.loads(t) for b in batches for t in b.args]
    assert stats.events_sent == 26 and stats.events_dropped == 0
    assert texts[0] == {"unserializable": "nested too deep to encode"}
    assert texts[1:] == [{"i": i} for i in range(25)]


def test_buffer_is_bounded_and_overflow_is_counted(make_config, bus):
    transport = SlowConnect(bus, delay_s=0.5)
    config = make_config(**{"producer.max_buffered_events": 1000, "producer.batch_events": 10_000})
    producer = Producer(run_id="r", rank=0, world_size=1, config=config, transport=transport)
    for i in range(5_000):
        producer.emit("op", ts_ns=i)
    assert producer.stats().buffered_events <= 1000
    stats = producer.close()
    assert stats.events_dropped >= 4_000
    assert stats.events_sent + stats.events_dropped == 5_000


def test_disabled_producer_does_nothing(make_config, bus):
    producer = Producer(run_id="r", rank=0, world_size=1, config=make_config(), transport=MemoryTransport(bus), enabled=False)
    producer.emit("op")
    producer.emit_batch(TraceBatch.from_rows([("op", "", "X", 1, 0, 0, 0, None, None, None, None)]))
    producer.offer_batch(TraceBatch.from_rows([("op", "", "X", 1, 0, 0, 0, None, None, None, None)]))
    producer.emit_fr_entries([])
    producer.close()
    assert bus.topics() == []
    assert producer.stats().broker == "disabled"


def test_broker_outage_spools_then_delivers_everything(make_config, bus):
    config = make_config(**{"producer.batch_events": 100, "producer.max_inflight_bytes": 4096})
    bus.available = False
    producer = Producer(run_id="r", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
    for i in range(2_000):
        producer.emit("op", ts_ns=i)
    deadline = time.monotonic() + 5
    while producer.stats().spool_bytes == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = producer.stats()
    assert stats.spool_bytes > 0 and stats.events_sent == 0 and stats.broker == "down"
    bus.available = True
    deadline = time.monotonic() + 10
    while producer.stats().events_sent < 2_000 and time.monotonic() < deadline:
        time.sleep(0.02)
    stats = producer.close()
    assert stats.events_sent == 2_000 and stats.spool_bytes == 0 and stats.events_dropped == 0
    assert trace_events(read_all(bus, config.topic_prefix)) == 2_000


def overflowing_spool(make_config, bus) -> Producer:
    """A producer whose broker is down and whose 20 kB spool cannot hold the 5,000 events it got."""
    config = make_config(**{"producer.batch_events": 100, "producer.max_inflight_bytes": 1024,
                            "producer.spool_max_bytes": 20_000})
    bus.available = False
    producer = Producer(run_id="r", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
    for i in range(5_000):
        producer.emit("op", ts_ns=i)
    return producer


def test_full_spool_drops_and_counts(make_config, bus):
    stats = overflowing_spool(make_config, bus).close(timeout_s=0.5)
    assert stats.spool_bytes <= 20_000
    assert stats.events_dropped > 0
    assert stats.events_spooled + stats.events_dropped == 5_000


def test_a_full_spool_costs_no_encoding_and_takes_messages_again_once_replayed(make_config, bus, monkeypatch):
    from rankstream.producers import sender as producer_module

    encoded = []
    original = producer_module.TraceBatch.from_columns
    monkeypatch.setattr(producer_module.TraceBatch, "from_columns",
                        staticmethod(lambda columns: encoded.append(len(columns["ph"])) or original(columns)))
    producer = overflowing_spool(make_config, bus)
    producer.flush(timeout_s=5)  # the broker is down: returns once everything is spooled or dropped
    stats = producer.stats()
    assert stats.events_dropped > 0 and stats.events_spooled + stats.events_dropped == 5_000
    assert producer.refusing
    fr_batches = []
    monkeypatch.setattr(producer_module, "FrBatch", lambda **fields: fr_batches.append(fields))
    producer.emit_fr_entries([{"record_id": 1}])
    producer.flush(timeout_s=5)
    assert fr_batches == []  # nor are Flight Recorder entries
    # every batch encoded was spooled, except the one the spool refused and the ones held in memory
    assert 0 < sum(encoded) <= stats.events_spooled + 3 * 100, (sum(encoded), stats)
    bus.available = True  # the broker is back: the spool drains and takes messages again
    deadline = time.monotonic() + 10
    while (producer.stats().spool_bytes or producer.refusing) and time.monotonic() < deadline:
        time.sleep(0.02)
    dropped = producer.stats().events_dropped
    for i in range(100):  # one batch: with this small in-flight cap, every message goes by the spool
        producer.emit("later", ts_ns=i)
    stats = producer.close()
    assert stats.events_dropped == dropped and stats.events_sent == stats.events_spooled == 5_000 - dropped + 100


def test_while_the_spool_refuses_emit_drops_and_counts_without_queueing(make_config, bus):
    from rankstream.schemas.trace import TraceBatch

    producer = overflowing_spool(make_config, bus)
    producer.flush(timeout_s=5)
    assert producer.refusing
    before = producer.stats()
    for i in range(1_000):
        producer.emit("more", "user_counter", "C", ts_ns=i, dur_ns=0, pid=0, tid=0, step=None, flow_id=None,
                      correlation_id=None, args={"value": 1.0})
    batch = TraceBatch.from_rows([("window", "cpu_op", "X", i, 1, 0, 0, None, None, None, None) for i in range(50)])
    assert not producer.offer_batch(batch)
    after = producer.stats()
    assert after.buffered_events == 0  # nothing queued for the sender to drop later
    assert after.events_emitted - before.events_emitted == 1_050
    assert after.events_dropped - before.events_dropped == 1_050
    stats = producer.close(timeout_s=0.5)
    assert stats.events_spooled + stats.events_dropped == stats.events_emitted == 6_050


def test_a_spool_refuses_while_as_full_as_at_its_last_refusal_and_takes_again_after_a_segment_goes(tmp_path,
                                                                                                    monkeypatch):
    from rankstream.producers import spool as spool_module
    from rankstream.producers.spool import Spool, SpooledMessage

    monkeypatch.setattr(spool_module, "_SEGMENT_BYTES", 2_000)  # several segments
    spool = Spool(tmp_path, "r", 0, max_bytes=5_000)
    message = SpooledMessage("topic", b"key", b"x" * 900, events=10)
    while spool.append(message):
        assert not spool.would_refuse()
    assert spool.would_refuse()  # the producer now drops without encoding
    spool.remove_segment(spool.oldest_segment())  # replay delivered the oldest segment
    assert spool.has_pending() and not spool.would_refuse()
    assert spool.append(message)


class StopsAnswering(MemoryTransport):
    """Delivers the first messages (so the broker counts as up), then takes messages and never
    reports on them: a Kafka client force-closed at shutdown before it failed its batches."""

    def __init__(self, bus, answered=2):
        super().__init__(bus)
        self.answered = answered

    def send(self, topic, key, value, *, done):
        if self.answered > 0:
            self.answered -= 1
            super().send(topic, key, value, done=done)


def test_messages_never_acknowledged_by_close_are_spooled_and_resent(make_config, bus):
    config = make_config(**{"producer.batch_events": 100})
    first = Producer(run_id="r", rank=1, world_size=2, config=config, transport=StopsAnswering(bus))
    time.sleep(0.2)  # the rank's metadata is delivered: the broker is up
    for i in range(700):
        first.emit("unacknowledged", ts_ns=i)
    stats = first.close(timeout_s=0.3)
    assert stats.events_spooled >= 500 and stats.events_sent + stats.events_spooled == 700 and stats.events_dropped == 0
    second = Producer(run_id="r", rank=1, world_size=2, config=config, transport=MemoryTransport(bus))
    second.close()
    assert trace_events(read_all(bus, config.topic_prefix)) == 700


def test_a_restarted_rank_resends_what_its_previous_process_spooled(make_config, bus):
    config = make_config(**{"producer.batch_events": 100})
    bus.available = False
    first = Producer(run_id="r", rank=3, world_size=4, config=config, transport=MemoryTransport(bus))
    for i in range(700):
        first.emit("before-crash", ts_ns=i)
    assert first.close(timeout_s=0.2).events_spooled == 700
    bus.available = True
    second = Producer(run_id="r", rank=3, world_size=4, config=config, transport=MemoryTransport(bus))
    second.emit("after-restart", ts_ns=1)
    second.close()
    envelopes = read_all(bus, config.topic_prefix)
    assert trace_events(envelopes) == 701
    assert len({e.session_id for e in envelopes}) == 2


def test_close_returns_within_its_timeout_when_the_broker_never_answers(make_config, bus):
    bus.available = False
    producer = Producer(run_id="r", rank=0, world_size=1, config=make_config(), transport=MemoryTransport(bus))
    producer.emit("op")
    started = time.monotonic()
    producer.close(timeout_s=1.0)
    assert time.monotonic() - started < 2.5


def test_oversized_batches_are_split_not_lost(make_config, bus):
    config = make_config(**{"producer.batch_events": 64})
    producer = Producer(run_id="r", rank=0, world_size=1, config=config, transport=MemoryTransport(bus))
    big_args = {"blob": "x" * 500_000}
    for i in range(64):
        producer.emit("op", ts_ns=i, args=big_args)
    stats = producer.close()
    assert stats.events_sent == 64 and stats.events_dropped == 0
    assert len([e for e in read_all(bus, config.topic_prefix) if e.kind is PayloadKind.TRACE_BATCH]) > 1


@pytest.mark.parametrize("call", ["emit", "emit_fr_entries", "emit_process_groups", "emit_rank_metadata"])
def test_calls_after_close_are_harmless(make_config, bus, call):
    producer = Producer(run_id="r", rank=0, world_size=1, config=make_config(), transport=MemoryTransport(bus))
    producer.close()
    args = {"emit": ("op",), "emit_fr_entries": ([],), "emit_process_groups": ([],), "emit_rank_metadata": ()}[call]
    getattr(producer, call)(*args)
    producer.close()


class RefusesSomeBatches(MemoryTransport):
    """The broker fails every third trace batch with ``error`` the first time it is sent."""

    def __init__(self, bus, error):
        super().__init__(bus)
        self.error, self.attempts, self.seen = error, 0, set()

    def send(self, topic, key, value, *, done):
        self.attempts += topic.endswith("trace")
        if topic.endswith("trace") and value not in self.seen:
            self.seen.add(value)
            if len(self.seen) % 3 == 0:
                done(self.error)
                return
        super().send(topic, key, value, done=done)


def _emit_through(config, transport, events: int = 3_000) -> Producer:
    """A producer on ``transport`` that has been handed ``events`` events (in batches of 100)."""
    producer = Producer(run_id="r", rank=0, world_size=1, config=config, transport=transport)
    for i in range(events):
        producer.emit("op", ts_ns=i)
    return producer


def test_a_message_the_broker_refuses_for_good_is_dropped_counted_and_not_retried(make_config, bus):
    config = make_config(**{"producer.batch_events": 100})
    transport = RefusesSomeBatches(bus, MessageRefused("MessageSizeTooLargeError: MESSAGE_TOO_LARGE"))
    stats = _emit_through(config, transport).close()
    delivered = trace_events(read_all(bus, config.topic_prefix))
    assert stats.events_dropped > 0 and stats.spool_bytes == 0
    assert delivered + stats.events_dropped == 3_000
    assert transport.attempts == len(transport.seen) == 30  # each batch sent once: nothing retried
    assert "refused" in stats.last_error and "MESSAGE_TOO_LARGE" in stats.last_error


def test_a_message_failed_transiently_is_kept_and_delivered(make_config, bus):
    config = make_config(**{"producer.batch_events": 100})
    transport = RefusesSomeBatches(bus, TimeoutError("request timed out"))
    producer = _emit_through(config, transport)
    deadline = time.monotonic() + 20
    while producer.stats().events_sent < 3_000 and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = producer.close()
    assert stats.events_dropped == 0 and stats.send_failures > 0  # counted, though nothing was lost
    batches = {(e.stream, e.session_id, e.seq): e for e in read_all(bus, config.topic_prefix)}  # resends share a key
    assert trace_events(batches.values()) == 3_000


def test_an_event_dropped_as_invalid_is_counted_once_when_the_rest_must_be_split(make_config, bus):
    """The events left after dropping an invalid one, too large for one message, are halved: the
    dropped event must not come back in a half and be counted again."""
    producer = Producer(run_id="r", rank=0, world_size=1, config=make_config(), transport=MemoryTransport(bus))
    blob = "x" * (6 << 20)  # three of these exceed one message
    for i in range(3):
        producer.emit("big", ts_ns=i + 1, args={"blob": blob})
    producer.emit("bad", ts_ns="not-a-time")
    stats = producer.close(timeout_s=30)
    assert (stats.events_sent, stats.events_dropped) == (3, 1), stats
