"""Hostile bus messages: every malformed message lands in ``rejects`` with a reason, the store never
crashes, and the valid messages interleaved with them all arrive, exactly once.

Malformed messages are made from real ones (a synthetic job's messages) by hypothesis: truncated
or random bytes, wrong types, missing fields, huge strings and arrays, deep nesting, NaN and
infinite numbers, negative or absurd durations, unknown envelope and payload versions and kinds,
and a message filed under another run's key. 100 examples x 100 messages = 10,000 by default
(``--long``: 100,000). Conflicting repeats (a batch key seen before, with other content) come after
the interleaving: the first message with a key is the one kept.
"""

import dataclasses
import random

import duckdb
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.doubles import MemorySource, MemoryTransport
from rankstream.consumers.store import Store
from tests.doubles import MemoryBus
from rankstream.producers.producer import Producer
from rankstream.schemas import all_topics
from rankstream.demo.synthetic import SyntheticJob, run_synthetic_rank

from rankstream.schemas.codec import decode
from rankstream.status import RUNS_SQL

from .damage import MUTATIONS, mutate, with_payload_of, with_seq

PER_EXAMPLE = 100


@pytest.fixture(scope="module")
def valid_messages(tmp_path_factory):
    """(topic, key, value) of a small synthetic job, and its number of trace events."""
    from rankstream.schemas.settings import load_config, with_overrides

    config = load_config({"state_dir": tmp_path_factory.mktemp("fuzz"), "topic_prefix": "fz"}, env={})
    config = with_overrides(config, **{"producer.batch_events": 50})  # several batches per rank, uneven
    bus = MemoryBus(partitions=2)
    emitted = 0
    for rank in range(2):
        producer = Producer(run_id="fuzz", rank=rank, world_size=2, config=config, transport=MemoryTransport(bus))
        emitted += run_synthetic_rank(SyntheticJob("fuzz", 2, 3, events_per_step=60), rank, producer)
        producer.close()
    records = [r for topic in bus.topics() for p in range(bus.partitions) for r in bus.read(topic, p, 0, 10**6)]
    return [(r.topic, r.key, r.value) for r in records], emitted


def _conflicting_pairs(messages) -> list[tuple[int, int]]:
    """(i, j): trace batches i and j whose event counts differ, so j's payload under i's key conflicts."""
    envelopes = {i: decode(value) for i, (_, _, value) in enumerate(messages)}
    counts = {i: e.payload.count for i, e in envelopes.items() if e.kind.value == "trace_batch"}
    return [(i, j) for i in counts for j in counts if counts[i] != counts[j]]


def consume_all(bus):
    store = Store(duckdb.connect())
    source = MemorySource(bus, all_topics("fz"))
    source.open(store.offsets())
    while records := source.poll(0, 37):
        store.write(records)
    return store


def test_malformed_messages_are_rejected_and_valid_ones_all_arrive(valid_messages, long_mode):
    messages, emitted = valid_messages
    examples = 1000 if long_mode else 100
    pairs = _conflicting_pairs(messages)
    tried = []

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.integers(0, len(messages) - 1), st.sampled_from(MUTATIONS), st.integers(0, 2**32)),
                    min_size=PER_EXAMPLE, max_size=PER_EXAMPLE), st.randoms(use_true_random=False),
           st.lists(st.sampled_from(pairs), max_size=5, unique=True))
    def run(plan, order, repeats):
        bad = [mutate(messages[index], how, random.Random(seed)) for index, how, seed in plan]
        bus = MemoryBus(partitions=2)
        interleaved = bad + list(messages)
        order.shuffle(interleaved)
        for topic, key, value in interleaved:
            bus.append(topic, key, value)
        bus.append(*messages[0])  # a repeat of a valid message: deduplicated, not rejected
        bad += [with_payload_of(messages[i], messages[j]) for i, j in repeats]
        for message in bad[len(plan):]:
            bus.append(*message)
        store = consume_all(bus)
        rejects = store.connection.execute("SELECT count(*), count(*) FILTER (WHERE reason <> '') FROM rejects").fetchall()[0]
        events = store.connection.execute("SELECT count(*) FROM trace_events").fetchall()[0][0]
        batches = store.connection.execute("SELECT count(*) FROM ingested_batches").fetchall()[0][0]
        store.connection.close()
        assert rejects == (len(bad), len(bad)), sorted({how for _, how, _ in plan})
        assert events == emitted and batches == len(messages)
        tried.append(len(bad))

    run()
    assert sum(tried) >= examples * PER_EXAMPLE  # 10,000 malformed messages tried, none crashed the store


@pytest.mark.parametrize("how", MUTATIONS)
def test_each_kind_of_damage_is_rejected_with_a_reason(valid_messages, how):
    messages, emitted = valid_messages
    rng = random.Random(how)
    bus = MemoryBus(partitions=2)
    for index in range(0, len(messages), 3):
        bus.append(*mutate(messages[index], how, rng))
    store = consume_all(bus)
    reasons = store.connection.execute("SELECT reason FROM rejects").fetchall()
    assert len(reasons) == len(range(0, len(messages), 3)) and all(r for (r,) in reasons), how


def test_repeats_and_sequence_gaps(valid_messages):
    """An exact repeat is a resend (stored once); a repeat with other content is rejected with a
    reason; a message past a gap is kept and the gap shows in ``status`` as missing messages."""
    messages, emitted = valid_messages
    first, other = _conflicting_pairs(messages)[0]
    original = decode(messages[first][2])
    stream = dataclasses.replace(original.key, seq=0)
    last_seq = max(e.seq for e in (decode(v) for _, _, v in messages) if dataclasses.replace(e.key, seq=0) == stream)
    bus = MemoryBus(partitions=2)
    for message in messages:
        bus.append(*message)
    bus.append(*messages[first])
    bus.append(*with_payload_of(messages[first], messages[other]))
    bus.append(*with_seq(messages[first], last_seq + 5))  # seqs last+1 .. last+4 never arrive
    store = consume_all(bus)
    con = store.connection
    reasons = [r for (r,) in con.execute("SELECT reason FROM rejects").fetchall()]
    assert len(reasons) == 1 and reasons[0].startswith("conflicting repeat"), reasons
    assert con.execute("SELECT count(*) FROM trace_events").fetchall()[0][0] == emitted + original.payload.count
    missing = {row["run_id"]: row["missing_messages"] for row in con.sql(RUNS_SQL).to_arrow_table().to_pylist()}
    assert missing == {"fuzz": 4}


@pytest.mark.parametrize("where", ["same poll", "stored earlier"])
def test_a_repeat_with_other_events_of_the_same_count_is_rejected(valid_messages, where):
    """The same batch key, the same number of events, other times: another batch, not a resend
    (it used to be skipped silently)."""
    messages, emitted = valid_messages
    first = next(i for i, (_, _, value) in enumerate(messages) if decode(value).kind.value == "trace_batch")
    envelope = msgpack.unpackb(messages[first][2], raw=False, strict_map_key=False)
    shifted = np.frombuffer(envelope["payload"]["int"]["ts_ns"], "<i8") + 1000
    envelope["payload"]["int"]["ts_ns"] = shifted.astype("<i8").tobytes()
    altered = (messages[first][0], messages[first][1], msgpack.packb(envelope, use_bin_type=True))
    bus = MemoryBus(partitions=2)
    store = Store(duckdb.connect())
    for message in messages:
        bus.append(*message)
    if where == "stored earlier":
        _consume_into(store, bus)
    bus.append(*messages[first])  # a true resend: skipped
    bus.append(*altered)
    _consume_into(store, bus)
    reasons = [r for (r,) in store.connection.execute("SELECT reason FROM rejects").fetchall()]
    assert len(reasons) == 1 and "the repeat is other events" in reasons[0], reasons
    assert store.connection.execute("SELECT count(*) FROM trace_events").fetchall()[0][0] == emitted


def _consume_into(store, bus) -> None:
    source = MemorySource(bus, all_topics("fz"))
    source.open(store.offsets())
    while records := source.poll(0, 37):
        store.write(records)
