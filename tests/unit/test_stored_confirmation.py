"""Acknowledged is not stored: the delivery keeps what the broker acknowledged until the
materializer announces it stored, on the in-memory bus and a real spool directory.

The announcements themselves are made by the real announcer from real commits; the end-to-end
path over the real broker is in ``tests/reliability/test_fault_matrix.py``.
"""

import duckdb
import pytest

from rankstream.consumers.store import Store
from rankstream.consumers.stored_announcer import StoredAnnouncer
from rankstream.producers.delivery import Delivery
from rankstream.producers.spool import Spool, SpooledMessage
from rankstream.consumers.prepare import prepare
from rankstream.schemas.codec import encode_wire, peek_sequence
from rankstream.schemas.envelope import PayloadKind
from rankstream.schemas.records import RankMeta
from rankstream.schemas.stored import decode_stored, merge_ranges
from rankstream.schemas.topics import Record
from tests.doubles import MemoryTransport

DEAD_PID = 2 ** 22 + 12345  # above the kernel's pid_max: no process has it


def message(seq: int, session: str = "s1", size: int = 0) -> SpooledMessage:
    value = encode_wire(run_id="job", rank=0, world_size=1, session_id=session, seq=seq,
                        kind=PayloadKind.RANK_META, wire_payload=RankMeta(fields={
                            "host": "h" + "x" * size, "pid": 1, "started_at_ns": 1}).to_wire())
    return SpooledMessage("t.control", b"job/0", value, 1, sequence=("control", session, seq))


@pytest.fixture
def spool(tmp_path):
    return Spool(tmp_path / "spool", "job", 0, max_bytes=1 << 30)


def delivery(bus, spool, **options) -> Delivery:
    options.setdefault("incarnation_check_s", 0.0)
    return Delivery(MemoryTransport(bus), spool, 1 << 20, confirmed=True, **options)


def _seq(value: bytes) -> int:
    return peek_sequence(value)[2]


def spooled_sequences(spool) -> list[int]:
    return sorted(m.sequence[2] for path in spool.segments() for m in Spool.read_segment(path))


def test_acknowledged_messages_wait_for_the_announcement_and_the_rest_is_spooled_at_close(bus, spool):
    sending = delivery(bus, spool)
    for seq in range(10):
        sending.submit(message(seq))
    sending.pump()
    assert sending.unconfirmed() == 10 and not spool.segments()
    sending.confirm({("control", "s1"): [(0, 5)]})
    sending.pump()
    assert sending.unconfirmed() == 4
    sending.drain(timeout_s=0.5)  # nothing more is announced
    assert spooled_sequences(spool) == [6, 7, 8, 9]
    assert all(m.resend for path in spool.segments() for m in Spool.read_segment(path))


def test_a_replayed_segment_is_deleted_only_once_every_message_in_it_is_announced(bus, spool):
    for seq in range(6):
        assert spool.append(message(seq))
    spool.close()
    sending = delivery(bus, spool)
    sending.pump()
    sending.pump()  # the replay finished: the broker acknowledged the whole segment
    acked = spool.area("acked")
    assert not spool.segments() and len(acked.segments()) == 1 and sending.unconfirmed() == 6
    sending.confirm({("control", "s1"): [(0, 4)]})
    sending.pump()
    assert len(acked.segments()) == 1
    sending.confirm({("control", "s1"): [(0, 5)]})
    sending.pump()
    assert not acked.segments() and sending.unconfirmed() == 0


def test_past_its_memory_cap_the_window_goes_to_disk_and_a_broker_restart_resends_all_of_it(bus, spool):
    sending = delivery(bus, spool, resend_window_bytes=4_000)
    for seq in range(40):
        sending.submit(message(seq, size=500))
    sending.pump()
    sending.pump()
    assert spool.area("acked").segments() and sending.unconfirmed() == 40
    bus.restart()
    for _ in range(20):
        sending.pump()
    resent = [r for topic in bus.topics() for p in range(bus.partitions) for r in bus.read(topic, p, 0, 1000)]
    assert sorted(_seq(r.value) for r in resent) == list(range(40))


def test_what_the_acked_area_has_no_room_for_at_close_is_counted(bus, tmp_path):
    """Every acknowledged, unannounced message ends in the spool or in a counter: the window's
    memory cap sends the oldest to the acked area, whose cap is the spool's."""
    small = Spool(tmp_path / "spool", "job", 0, max_bytes=6_000)
    sending = delivery(bus, small, resend_window_bytes=2_000)
    for seq in range(40):
        sending.submit(message(seq, size=500))
    for _ in range(3):
        sending.pump()
    sending.drain(timeout_s=0.5)
    counters = sending.counters()
    assert counters.events_not_resent > 0 and counters.events_sent == 40
    assert len(spooled_sequences(small)) + counters.events_dropped + counters.events_not_resent == 40


def test_acked_segments_of_a_process_that_died_are_sent_again_by_the_next_one(bus, spool):
    acked = spool.area("acked")
    acked.directory.mkdir(parents=True)
    for seq in range(3):
        assert acked.append(message(seq, session="old"))
    acked.close()
    written = acked.segments()[0]
    written.rename(written.with_name(f"{written.stem.split('-')[0]}-{DEAD_PID}.seg"))
    sending = delivery(bus, spool)
    sending.pump()
    sending.pump()
    assert sorted(_seq(r.value) for p in range(bus.partitions) for r in bus.read("t.control", p, 0, 100)) == [0, 1, 2]


def test_the_announcer_announces_what_is_stored_including_what_a_previous_materializer_stored(tmp_path):
    store = Store(duckdb.connect(str(tmp_path / "t.duckdb")))
    records = [Record("t.control", 0, seq, b"job/0", message(seq).value, 0) for seq in (0, 1, 2, 5)]
    published: list[bytes] = []
    first = StoredAnnouncer(published.append, every_s=0.0)
    batch = prepare(records[:3])
    store.commit(batch)
    first.note(batch.keys, store.stored_sequences)
    assert [(s.sender, s.ranges) for s in decode_stored(published[-1])] == [(("job", 0, "control", "s1"), [(0, 2)])]
    second = StoredAnnouncer(published.append, every_s=0.0)  # a restarted materializer
    batch = prepare(records[3:])
    store.commit(batch)
    second.note(batch.keys, store.stored_sequences)
    assert [s.ranges for s in decode_stored(published[-1])] == [[(0, 2), (5, 5)]]


def test_ranges_merge_and_stay_disjoint():
    assert merge_ranges([(0, 2)], [3, 7, 5, 6]) == [(0, 3), (5, 7)]
    assert merge_ranges([(0, 9)], [4]) == [(0, 9)]


def test_a_rejected_message_read_twice_at_the_same_offset_is_one_reject_row(tmp_path):
    store = Store(duckdb.connect(str(tmp_path / "t.duckdb")))
    bad = Record("t.trace", 0, 7, b"job/0", b"\xc1 not msgpack", 0)
    store.write([bad])
    store.connection.execute("DELETE FROM consumer_offsets")  # as if the bus were read again
    store.write([bad])
    store.write([Record("t.trace", 0, 8, b"job/0", b"\xc1 not msgpack", 0)])
    assert store.connection.execute("SELECT kafka_offset FROM rejects ORDER BY 1").fetchall() == [(7,), (8,)]
    store.write([Record("t.trace", 0, 7, b"job/0", b"\xc1 other bytes", 0),  # a restarted broker reuses offsets
                 Record("t.trace", 0, 8, b"job/0", b"\xc1 not msgpack", 0)])
    assert store.connection.execute("SELECT kafka_offset, raw FROM rejects ORDER BY 1, 2").fetchall() == [
        (7, b"\xc1 not msgpack"), (7, b"\xc1 other bytes"), (8, b"\xc1 not msgpack")]
