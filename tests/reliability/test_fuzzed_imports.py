"""The file importers under generated input (hypothesis), seeded with the probe's files.

Whatever a trace file or a Flight Recorder dump holds, its first pass either refuses the whole
file in one line naming it (``BadInput``), or accounts for every item: each event or entry is
imported or becomes a reject naming its index, never dropped silently, never a traceback.
"""

import json
import pickle

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rankstream.producers.fr_reader import read_fr_dump
from rankstream.producers.import_trace import scan_trace
from rankstream.schemas.errors import BadInput
from rankstream.schemas.fields import check_record
from rankstream.schemas.records import FR_FIELDS

from .test_hostile_files import _pickle_bomb

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: Values a field may hold in a hostile file: every JSON type, integers past 64 bits, numeric text.
ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
    st.sampled_from([0, 1, -1, 2**62, 2**63 - 1, 2**63, 2**64, 9223372036854775]),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8), st.sampled_from(["5", "", "X"]),
    st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)

TRACE_EVENT = st.dictionaries(
    st.sampled_from(["ph", "name", "cat", "pid", "tid", "ts", "dur", "args", "id"]),
    st.one_of(ANY_VALUE, st.sampled_from(["X", "i", "B", "E", "M", "C", "s", "f"])), max_size=9)
GOOD_EVENT = {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 0, "tid": 1, "ts": 10, "dur": 5}


def _one_line_naming(error: BadInput, path) -> bool:
    message = str(error)
    return message.startswith(str(path)) and "\n" not in message


@FUZZ
@given(events=st.lists(st.one_of(TRACE_EVENT, st.just(GOOD_EVENT)), max_size=12),
       wrapped=st.booleans(), cut=st.one_of(st.none(), st.integers(0, 400)))
@example(events=[dict(GOOD_EVENT, ts=2**70)], wrapped=False, cut=None)
@example(events=[dict(GOOD_EVENT, ts=9223372036854775)], wrapped=True, cut=None)
@example(events=[{k: v for k, v in GOOD_EVENT.items() if k != "ts"}, GOOD_EVENT], wrapped=False, cut=None)
@example(events=[GOOD_EVENT, dict(GOOD_EVENT, pid=2**64)], wrapped=True, cut=None)
def test_every_trace_event_is_imported_or_rejected_by_index(tmp_path_factory, events, wrapped, cut):
    path = tmp_path_factory.mktemp("trace") / "rank0.json"
    text = json.dumps({"traceEvents": events} if wrapped else events)
    path.write_text(text if cut is None else text[:cut])
    try:
        info = scan_trace(path, fallback_rank=0)
    except BadInput as error:
        assert _one_line_naming(error, path), str(error)
        return
    padding = sum(event == {} for event in events)  # Kineto pads its event list with {}: not an event
    assert info.events + len(info.rejects) == len(events) - padding or cut is not None  # a cut file may lose its tail
    assert [r["item"] for r in info.rejects] == sorted({r["item"] for r in info.rejects})
    assert all(r["source"] == str(path) and r["reason"] for r in info.rejects)


FR_ENTRY = st.dictionaries(
    st.sampled_from(["record_id", "pg_id", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name",
                     "process_group", "time_created_ns", "input_sizes", "output_sizes", "state", "retired",
                     "time_discovered_started_ns", "duration_ms", "frames"]),
    ANY_VALUE, max_size=10)
GOOD_ENTRY = {"record_id": 0, "pg_id": 0, "collective_seq_id": 1, "op_id": 1, "profiling_name": "nccl:all_reduce",
              "process_group": ["0", "default_pg"], "time_created_ns": 5, "state": "completed"}


@FUZZ
@given(entries=st.lists(st.one_of(FR_ENTRY, st.just(GOOD_ENTRY)), max_size=10),
       as_pickle=st.booleans(), version=st.sampled_from(["2.10", "2.4", 7, None]))
@example(entries=[dict(GOOD_ENTRY, record_id=2**64)], as_pickle=True, version="2.10")
@example(entries=[dict(GOOD_ENTRY, input_sizes=[["a"]]), GOOD_ENTRY], as_pickle=False, version="2.10")
@example(entries=[dict(GOOD_ENTRY, time_created_ns="5"), GOOD_ENTRY], as_pickle=True, version="2.10")
def test_every_flight_recorder_entry_is_imported_or_rejected_by_index(tmp_path_factory, entries, as_pickle, version):
    path = tmp_path_factory.mktemp("fr") / "rank_0"
    dump = {"version": version, "entries": entries}
    path.write_bytes(pickle.dumps(dump) if as_pickle else json.dumps(dump).encode())
    try:
        read = read_fr_dump(path, 0)
    except BadInput as error:
        assert _one_line_naming(error, path), str(error)
        return
    assert len(read.entries) + len(read.rejects) == len(entries)
    assert all(check_record(entry, FR_FIELDS, "FR entry") == entry for entry in read.entries)
    assert all(r["source"] == str(path) and f"entry {r['item']}" in r["reason"] for r in read.rejects)


@pytest.mark.parametrize("content", [b"{}", pickle.dumps({}), _pickle_bomb(), b"[" * 100_000,
                                     pickle.dumps({"entries": "x"}), b"\x80\x05garbage"])
def test_the_probes_whole_file_failures_are_one_line(tmp_path, content):
    path = tmp_path / "rank_0"
    path.write_bytes(content)
    with pytest.raises(BadInput) as error:
        read_fr_dump(path, 0)
    assert _one_line_naming(error.value, path)
