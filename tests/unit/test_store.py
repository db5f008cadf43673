"""The DuckDB store: exactly-once application, dedup by batch key, rejects, replay."""

import duckdb
import msgpack
import pytest

from tests.doubles import MemorySource, MemoryTransport
from rankstream.schemas.topics import Record
from rankstream.consumers.store import Store
from rankstream.producers.producer import Producer
from rankstream.schemas import all_topics
from rankstream.demo.synthetic import SyntheticJob, run_synthetic_rank

TABLES = ("trace_events", "fr_entries", "process_groups", "heartbeats", "rank_metadata", "rejects")


def produce_job(bus, config, ranks=2, steps=3):
    job = SyntheticJob("job", ranks, steps, events_per_step=200)
    emitted = 0
    for rank in range(ranks):
        producer = Producer(run_id="job", rank=rank, world_size=ranks, config=config, transport=MemoryTransport(bus))
        emitted += run_synthetic_rank(job, rank, producer)
        producer.close()
    return emitted


def consume(bus, store, prefix, max_records=7):
    source = MemorySource(bus, all_topics(prefix))
    source.open(store.offsets())
    while records := source.poll(0, max_records):
        store.write(records)


def snapshot(connection):
    """Every projection, sorted, as plain rows: what a replay must reproduce."""
    return {t: sorted(map(repr, connection.execute(f"SELECT * FROM {t}").fetchall())) for t in TABLES}


@pytest.fixture
def store(tmp_path):
    return Store(duckdb.connect(str(tmp_path / "t.duckdb")))


def test_every_event_lands_once(make_config, bus, store):
    config = make_config()
    emitted = produce_job(bus, config)
    consume(bus, store, config.topic_prefix)
    con = store.connection
    assert con.execute("SELECT count(*) FROM trace_events").fetchone()[0] == emitted
    assert con.execute("SELECT count(DISTINCT rank) FROM fr_entries").fetchone()[0] == 2
    assert con.execute("SELECT count(*) FROM ranks").fetchone()[0] == 2
    assert con.execute("SELECT ended_at IS NOT NULL FROM runs").fetchone()[0]


def test_replaying_from_offset_zero_gives_identical_tables(make_config, bus, store, tmp_path):
    config = make_config()
    produce_job(bus, config)
    consume(bus, store, config.topic_prefix, max_records=5)
    first = snapshot(store.connection)
    store.reset()
    consume(bus, store, config.topic_prefix, max_records=50)
    assert snapshot(store.connection) == first
    other = Store(duckdb.connect(str(tmp_path / "other.duckdb")))
    consume(bus, other, config.topic_prefix, max_records=1000)
    assert snapshot(other.connection) == first


def test_resent_batches_are_skipped_by_batch_key(make_config, bus, store):
    config = make_config()
    emitted = produce_job(bus, config, ranks=1)
    for topic in bus.topics():  # a producer resend: every message appears a second time
        for partition in range(bus.partitions):
            for record in bus.read(topic, partition, 0, 10_000):
                bus.append(topic, record.key, record.value)
    consume(bus, store, config.topic_prefix)
    assert store.connection.execute("SELECT count(*) FROM trace_events").fetchone()[0] == emitted


def test_bad_messages_go_to_rejects_with_coordinates_and_the_rest_flows(make_config, bus, store):
    config = make_config()
    topic = all_topics(config.topic_prefix)[0]
    bus.append(topic, b"job/0", b"\xc1 not msgpack")
    emitted = produce_job(bus, config, ranks=1)
    bus.append(topic, b"job/0", msgpack.packb({"v": 1, "run": "job", "rank": 0}))
    consume(bus, store, config.topic_prefix)
    con = store.connection
    assert con.execute("SELECT count(*) FROM trace_events").fetchone()[0] == emitted
    rejects = con.execute("SELECT topic, partition, kafka_offset, run_id, rank, reason, raw FROM rejects "
                          "ORDER BY kafka_offset").fetchall()
    assert len(rejects) == 2
    assert rejects[0][0] == topic and rejects[0][3:5] == ("job", 0)
    assert "not msgpack" in rejects[0][5] and rejects[0][6] == b"\xc1 not msgpack"
    assert "'world'" in rejects[1][5]


def test_offsets_commit_with_rows_and_a_failed_write_changes_nothing(store):
    good = Record("t", 0, 0, b"k", b"\xc1", 0)
    store.write([good])
    assert store.offsets() == {("t", 0): 1}

    class Boom(Exception):
        pass

    original = store._insert_rejects

    def failing_insert(arrow):
        original(arrow)
        raise Boom()

    store._insert_rejects = failing_insert
    with pytest.raises(Boom):
        store.write([Record("t", 0, 1, b"k", b"\xc1", 0)])
    assert store.offsets() == {("t", 0): 1}
    assert store.connection.execute("SELECT count(*) FROM rejects").fetchone()[0] == 1


def test_the_materializer_polls_again_only_once_the_committer_took_what_it_handed_over():
    """A poll made while a prepared batch still waits for the committer would wait behind it too:
    ``wait_for_turn`` holds the next poll until the committer has taken every batch."""
    import threading

    from rankstream.consumers.materializer import _Committer

    release = threading.Event()

    class SlowStore:
        def commit(self, batch):
            release.wait(10)

    committer = _Committer(SlowStore(), on_commit=lambda batch, result: None)
    committer.submit("first")  # taken at once, then committing until released
    committer.submit("second")  # waits in the queue
    returned = threading.Event()
    threading.Thread(target=lambda: (committer.wait_for_turn(), returned.set()), daemon=True).start()
    assert not returned.wait(0.3)
    release.set()  # the first commit ends: the committer takes the second
    assert returned.wait(5)
    committer.close()
