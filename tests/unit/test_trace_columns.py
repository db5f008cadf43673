"""Whole-column conversion of trace events gives, value for value, what converting each event on
its own gives; batches survive the importer's temporary file and split by pid."""

import errno
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankstream.schemas.errors import BadInput, RankstreamError
from rankstream.consumers.projector import trace_table
from rankstream.producers.batch_file import BatchFile
from rankstream.producers.import_trace import scan_trace
from rankstream.producers.trace_columns import as_int, event_columns, finish_batch, trace_batches
from rankstream.schemas.trace import NULL_INT, TRACE_INT_COLUMNS, TraceBatch

STEPS = {7: ([1_000_000, 5_000_000], [4_000_000, 9_000_000], [1, 2]), 0: ([0], [500_000], [0])}
BASE_NS = 1_700_000_000_000_000_000


def reference(event: dict, base_ns: int, steps: dict) -> dict:
    """One event converted on its own: the behaviour the columns must match."""
    pid = as_int(event.get("pid", 0))
    relative = int(event.get("ts", 0) * 1000)
    found = steps.get(pid) or (next(iter(steps.values())) if len(steps) == 1 else None)
    step = None
    for start, end, number in zip(*found) if found else ():
        if start <= relative < end:
            step = number
    args = event.get("args")
    correlation = args.get("correlation", args.get("External id")) if isinstance(args, dict) else None
    flow = event.get("id") if event["ph"] in "stf" else None
    return {"name": str(event.get("name", "")), "cat": str(event.get("cat", "")), "ph": event["ph"],
            "ts_ns": base_ns + relative, "dur_ns": int(event.get("dur", 0) * 1000), "pid": pid,
            "tid": as_int(event.get("tid", 0)), "step": step,
            "flow_id": as_int(flow) if flow is not None else None,
            "correlation_id": correlation if isinstance(correlation, int) else None,
            "args": args or None}


def decoded(batch: TraceBatch) -> list[dict]:
    """The batch back as one dict per event."""
    columns = {}
    for name in ("name", "cat", "ph"):
        codes, values = batch.string_column(name)
        columns[name] = [values[c] for c in codes]
    for name in TRACE_INT_COLUMNS:
        values, nulls = batch.int_column(name)
        columns[name] = [None if nulls is not None and null else int(v)
                         for v, null in zip(values, nulls if nulls is not None else [False] * batch.count)]
    columns["args"] = [None] * batch.count
    for at, text in zip(batch.args_positions(), batch.args):
        columns["args"][at] = json.loads(text)
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


#: Step edges (in µs) among the times, where an off-by-one in the span lookup would show.
TIME = (st.sampled_from([0, 500, 999.999, 1000, 4000, 5000, 8999, 9000]) | st.integers(0, 10**7)
        | st.floats(0, 10**7, allow_nan=False) | st.booleans())
EVENT = st.fixed_dictionaries(
    {"ph": st.sampled_from("XBEiCstf")},
    optional={"name": st.text(max_size=5) | st.integers(), "cat": st.text(max_size=3), "ts": TIME, "dur": TIME,
              "pid": st.sampled_from([0, 7, 3, "Spans", 2.0, True]), "tid": st.integers(0, 9) | st.text(max_size=3),
              "id": st.integers(0, 99) | st.text(max_size=3),
              "args": st.dictionaries(st.sampled_from(["correlation", "External id", "x", "é"]),
                                      st.integers(-5, 5) | st.text(max_size=3) | st.booleans(), max_size=3)},
)


@settings(max_examples=200, deadline=None)
@given(events=st.lists(EVENT, min_size=1, max_size=40), base_ns=st.sampled_from([0, BASE_NS]),
       steps=st.sampled_from([{}, STEPS, {7: STEPS[7]}]), size=st.integers(1, 50))
def test_columns_match_the_per_event_conversion(events, base_ns, steps, size):
    batches = [finish_batch(b, base_ns, steps) for b in trace_batches(event_columns(events), size)]
    assert all(b.count <= size for b in batches)
    assert [e for b in batches for e in decoded(b)] == [reference(e, base_ns, steps) for e in events]


def test_epoch_microseconds_stay_exact_to_the_nanosecond():
    """Composer writes epoch microseconds; float64 arithmetic on those times 1000 would round."""
    events = [{"ph": "X", "ts": 1_700_000_000_000_001 + i, "dur": 3} for i in range(5)]
    (batch,) = trace_batches(event_columns(events), 100)
    times, _ = finish_batch(batch, 0, {}).int_column("ts_ns")
    assert times.tolist() == [(1_700_000_000_000_001 + i) * 1000 for i in range(5)]


def test_a_time_that_overflows_is_null_not_wrapped_around():
    events = [{"ph": "X", "ts": 2**62}, {"ph": "X", "ts": 9_000_000_000_000_000.0}, {"ph": "X", "ts": 5}]
    (batch,) = trace_batches(event_columns(events), 100)
    times, _ = finish_batch(batch, BASE_NS, {}).int_column("ts_ns")
    assert times.tolist() == [NULL_INT, NULL_INT, BASE_NS + 5000]


def test_batches_round_trip_through_the_temporary_file_and_split_by_pid(tmp_path):
    events = [{"ph": "X", "name": f"op{i % 3}", "ts": i, "pid": i % 2, "args": {"i": i} if i % 4 else {}}
              for i in range(25)]
    batches = list(trace_batches(event_columns(events), 10))
    with BatchFile(tmp_path / "parked") as parked:
        for batch in batches:
            parked.append(batch)
    with BatchFile(tmp_path / "parked") as parked:
        read_back = list(parked)
        assert [decoded(b) for b in list(parked)] == [decoded(b) for b in batches]  # read twice
    assert [decoded(b) for b in read_back] == [decoded(b) for b in batches]
    for batch in read_back:
        pids, _ = batch.int_column("pid")
        for pid in (0, 1):
            part = batch.select(np.flatnonzero(pids == pid))
            assert decoded(part) == [e for e in decoded(batch) if e["pid"] == pid]


class FullDisk:
    """A file whose every write fails as on a full disk."""

    def seek(self, *args):
        return 0

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        pass


def test_a_full_temporary_disk_is_named_as_such_not_as_a_bad_trace(tmp_path, monkeypatch):
    """An OSError while reading a trace means a bad file; one while parking batches must not."""
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps([{"ph": "X", "name": "a", "ts": i, "dur": 1} for i in range(10)]))
    with BatchFile(tmp_path / "parked") as parked:
        monkeypatch.setattr(parked, "_file", FullDisk())
        with pytest.raises(RankstreamError, match=f"cannot park import batches in {tmp_path}.*No space left") as error:
            scan_trace(trace, batches=parked)
        assert not isinstance(error.value, BadInput)


@settings(max_examples=100, deadline=None)
@given(events=st.lists(EVENT, min_size=1, max_size=40), size=st.integers(1, 12))
def test_the_stored_args_column_puts_each_batchs_args_at_their_events(events, size):
    batches = [finish_batch(b, 0, {}) for b in trace_batches(event_columns(events), size)]
    stored = trace_table([("run", 0, batch) for batch in batches]).column("args").to_pylist()
    expected = [event["args"] for batch in batches for event in decoded(batch)]
    assert [None if text is None else json.loads(text) for text in stored] == expected
