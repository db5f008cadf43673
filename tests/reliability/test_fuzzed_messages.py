"""Hostile bus messages: every malformed message lands in ``rejects`` with a reason, the store never
crashes, and the valid messages interleaved with them all arrive, exactly once.

Malformed messages are made from real ones (a synthetic job's messages) by hypothesis: truncated
or random bytes, wrong types, missing fields, huge strings and arrays, deep nesting, NaN and
infinite numbers, negative or absurd durations, unknown envelope and payload versions and kinds,
and a message filed under another run's key. 100 examples x 100 messages = 10,000 by default
(``--long``: 100,000).
"""

import random

import duckdb
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rankstream.consumers.source import MemorySource
from rankstream.consumers.store import Store
from rankstream.deploy.memory_bus import MemoryBus
from rankstream.producers import Producer
from rankstream.schemas import all_topics
from rankstream.synthetic import SyntheticJob, run_synthetic_rank

from .damage import MUTATIONS, mutate

PER_EXAMPLE = 100


@pytest.fixture(scope="module")
def valid_messages(tmp_path_factory):
    """(topic, key, value) of a small synthetic job, and its number of trace events."""
    from rankstream.config import load_config

    config = load_config({"state_dir": tmp_path_factory.mktemp("fuzz"), "topic_prefix": "fz"}, env={})
    bus = MemoryBus(partitions=2)
    emitted = 0
    for rank in range(2):
        producer = Producer(run_id="fuzz", rank=rank, world_size=2, config=config, bus=bus)
        emitted += run_synthetic_rank(SyntheticJob("fuzz", 2, 3, events_per_step=60), rank, producer)
        producer.close()
    records = [r for topic in bus.topics() for p in range(bus.partitions) for r in bus.read(topic, p, 0, 10**6)]
    return [(r.topic, r.key, r.value) for r in records], emitted


def _store_tables(store):
    return {t: store.connection.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
            for t in ("trace_events", "rejects", "ingested_batches")}


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
    tried = []

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.integers(0, len(messages) - 1), st.sampled_from(MUTATIONS), st.integers(0, 2**32)),
                    min_size=PER_EXAMPLE, max_size=PER_EXAMPLE), st.randoms(use_true_random=False))
    def run(plan, order):
        bad = [mutate(messages[index], how, random.Random(seed)) for index, how, seed in plan]
        bus = MemoryBus(partitions=2)
        interleaved = bad + list(messages)
        order.shuffle(interleaved)
        for topic, key, value in interleaved:
            bus.append(topic, key, value)
        bus.append(*messages[0])  # a repeat of a valid message: deduplicated, not rejected
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
