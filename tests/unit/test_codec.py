"""The codec: round trips, typed failures for every kind of bad message, upcasting."""

from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankstream.schemas import (
    DecodeFailure, Envelope, FrBatch, Heartbeat, PayloadKind, PgConfig, RankMeta, TraceBatch, decode,
    encode, encode_wire,
)
from rankstream.schemas.records import HEARTBEAT_COUNTERS
from rankstream.schemas.fields import PayloadError
from rankstream.schemas.trace import row_problem

DATA = Path(__file__).parent.parent / "data"


def envelope(kind: PayloadKind, payload, seq: int = 0) -> Envelope:
    return Envelope(run_id="run", rank=1, world_size=4, stream=kind.stream, session_id="s1", seq=seq, kind=kind,
                    payload_version=2 if kind is PayloadKind.TRACE_BATCH else 1, sent_at_ns=123, payload=payload)


ROWS = [
    ("aten::mm", "cpu_op", "X", 1_000, 50, 7, 8, 3, None, 11, {"shapes": [[2, 2]]}),
    ("step", "user_annotation", "i", 2_000, 0, 7, 8, None, 5, None, None),
]


def test_trace_batch_round_trip_keeps_every_column():
    decoded = decode(encode(envelope(PayloadKind.TRACE_BATCH, TraceBatch.from_rows(ROWS))))
    assert isinstance(decoded, Envelope)
    batch = decoded.payload
    codes, names = batch.string_column("name")
    assert [names[c] for c in codes] == ["aten::mm", "step"]
    steps, null = batch.int_column("step")
    assert steps[0] == 3 and list(null) == [False, True]
    assert list(batch.int_column("flow_id")[1]) == [True, False]
    assert batch.args == ['{"shapes":[[2,2]]}'] and list(batch.args_positions()) == [0]


@pytest.mark.parametrize("kind,payload", [
    (PayloadKind.FR_BATCH, FrBatch(snapshot_ns=5, entries=[{
        "record_id": 0, "profiling_name": "nccl:all_reduce", "input_sizes": [[4, 4]], "input_dtypes": ["Float"],
        "frames": [{"name": "f", "filename": "a.py", "line": 3}], "state": "completed", "retired": True}])),
    (PayloadKind.PG_CONFIG, PgConfig(groups=[{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]}])),
    (PayloadKind.RANK_META, RankMeta(fields={"host": "h", "pid": 1, "started_at_ns": 2, "metadata": {"a": 1}})),
    (PayloadKind.HEARTBEAT, Heartbeat(fields={**{c: 1 for c in HEARTBEAT_COUNTERS}, "final": True})),
])
def test_record_payloads_round_trip(kind, payload):
    decoded = decode(encode(envelope(kind, payload)))
    assert isinstance(decoded, Envelope), decoded
    again = type(payload).from_wire(payload.to_wire())
    assert decoded.payload == again


def _valid_wire() -> dict:
    return msgpack.unpackb(encode(envelope(PayloadKind.TRACE_BATCH, TraceBatch.from_rows(ROWS))))


def _mutated(mutate) -> bytes:
    message = _valid_wire()
    mutate(message)
    return msgpack.packb(message)


@pytest.mark.parametrize("raw,reason", [
    (b"", "not msgpack"),
    (b"\xc1", "not msgpack"),
    (msgpack.packb([1, 2]), "must be a map"),
    (_mutated(lambda m: m.pop("run")), "'run'"),
    (_mutated(lambda m: m.update(rank="0")), "'rank' must be int"),
    (_mutated(lambda m: m.update(rank=9)), "not within world size"),
    (_mutated(lambda m: m.update(kind="telepathy")), "unknown payload kind"),
    (_mutated(lambda m: m.update(stream="fr")), "does not travel on stream"),
    (_mutated(lambda m: m.update(pv=99)), "version 99 is unknown"),
    (_mutated(lambda m: m.update(v=2)), "envelope version"),
    (_mutated(lambda m: m.update(seq=-1)), "seq non-negative"),
    (_mutated(lambda m: m["payload"].update(n=3)), "codes must be"),
    (_mutated(lambda m: m["payload"]["str"]["name"].__setitem__(0, [])), "code outside its dictionary"),
    (_mutated(lambda m: m["payload"]["int"].update(ts_ns=b"\x00" * 3)), "must be 16 bytes"),
    (_mutated(lambda m: m["payload"]["int"].update(dur_ns=(-5).to_bytes(8, "little", signed=True) * 2)),
     "duration is negative"),
    (_mutated(lambda m: m["payload"].update(args=[1])), "must be JSON text"),
    (_mutated(lambda m: m["payload"].update(args=["{}", "{}"])), "one uint32 event index per"),
    (_mutated(lambda m: m["payload"].update(args_at=(7).to_bytes(4, "little"))), "outside the batch"),
    (_mutated(lambda m: m.update(payload="x")), "expected a map"),
])
def test_bad_messages_become_typed_failures(raw, reason):
    result = decode(raw)
    assert isinstance(result, DecodeFailure)
    assert reason in result.reason


def test_failure_keeps_run_and_rank_when_the_envelope_was_readable():
    result = decode(_mutated(lambda m: m.update(pv=99)))
    assert (result.run_id, result.rank) == ("run", 1)


def test_size_limits_refuse_huge_strings_and_deep_nesting():
    huge = _mutated(lambda m: m.update(run="r" * (2 << 20)))
    assert "not msgpack" in decode(huge).reason
    deep = msgpack.packb({"v": 1, "payload": [[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]})
    assert isinstance(decode(deep), DecodeFailure)
    fr = FrBatch(snapshot_ns=1, entries=[{"record_id": 0, "profiling_name": "x", "frames": [{"name": 1.5}]}])
    assert "field 'name'" in decode(encode(envelope(PayloadKind.FR_BATCH, fr))).reason


def test_nan_in_metadata_is_refused():
    meta = RankMeta(fields={"host": "h", "pid": 1, "started_at_ns": 2, "metadata": {"loss": float("nan")}})
    assert "not finite" in decode(encode(envelope(PayloadKind.RANK_META, meta))).reason


def test_stored_v1_trace_batch_upcasts_on_read():
    decoded = decode((DATA / "trace_batch_v1.msgpack").read_bytes())
    assert isinstance(decoded, Envelope), decoded
    assert decoded.payload_version == 2
    codes, names = decoded.payload.string_column("name")
    assert [names[c] for c in codes] == ["aten::mm", "ProfilerStep#3"]
    assert list(decoded.payload.int_column("dur_ns")[0]) == [2500, 0]
    steps, null = decoded.payload.int_column("step")
    assert steps[0] == 3 and null[1]
    assert decoded.payload.args == ['{"shape":[2,2]}'] and list(decoded.payload.args_positions()) == [0]


def test_producer_values_that_do_not_fit_are_named_never_coerced_or_nulled():
    """An integer of 71 bits used to become NULL and the text "7" the number 7, silently."""
    good = ("n", "c", "X", 1, 0, 0, 0, None, None, None, None)
    assert row_problem(good) is None
    cases = {
        ("n", "c", "X", 1, 0, 0, 0, 2**70, None, None, None): "field 'step': integer 1180591620717411303424 does not fit",
        ("n", "c", "X", 1, 0, 0, 0, None, "7", None, None): "field 'flow_id': expected an integer, got str",
        ("n", "c", "X", 1, 0, 2**63, 0, None, None, None, None): "field 'pid': integer",
        ("n", "c", "X", 1.5, 0, 0, 0, None, None, None, None): "field 'ts_ns': expected an integer, got float",
        ("n", "c", "X", 2**63 - 1, 0, 0, 0, None, None, None, None): "field 'ts_ns': 9223372036854775807 is not a time",
        ("n", "c", "X", 1, -5, 0, 0, None, None, None, None): "field 'dur_ns': -5 is negative",
    }
    for row, problem in cases.items():
        assert problem in (row_problem(row) or ""), (row, row_problem(row))
        with pytest.raises((ValueError, PayloadError)):
            TraceBatch.from_rows([good, row]).check_values()
    assert row_problem(("n", "c", "X", np.int64(5), 0, 0, 0, None, None, None, None)) is None  # numpy integers are integers


def test_unhashable_names_become_their_text():
    batch = TraceBatch.from_rows([("n", "c", "X", 1, 0, 0, 0, None, None, None, None),
                                  (["unhashable"], 1, "X", 2, 0, 0, 0, None, None, None, object())])
    decoded = decode(encode_wire(run_id="r", rank=0, world_size=1, session_id="s", seq=0,
                                 kind=PayloadKind.TRACE_BATCH, wire_payload=batch.to_wire()))
    assert isinstance(decoded, Envelope)
    assert decoded.payload.string_column("name")[1] == ["n", "['unhashable']"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_decode_never_raises_on_random_bytes(raw):
    assert isinstance(decode(raw), (DecodeFailure, Envelope))


json_values = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=5),
                           lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3),
                                                                                            children, max_size=3),
                           max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["v", "run", "rank", "world", "stream", "session", "seq", "kind", "pv",
                                        "sent_ns", "payload"]), json_values))
def test_decode_never_raises_on_random_envelopes(message):
    assert isinstance(decode(msgpack.packb(message)), (DecodeFailure, Envelope))
