"""DuckDB's reader for plain trace arrays gives the importer's rows, or declines and inserts nothing."""

import gzip
import json

import duckdb
import pytest

from rankstream.schemas.errors import BadInput
from rankstream.consumers.projector import trace_table
from rankstream.consumers.query_server import execute_to_arrow
from rankstream.producers.batch_file import BatchFile
from rankstream.producers.import_trace import file_parts, scan_trace
from rankstream.producers.trace_sql_reader import insert_array_trace
from rankstream.schemas.tables import ddl

EPOCH_US = 1_700_000_000_000_000

#: One of everything the fast reader takes: int and float times, missing fields, escapes, flows,
#: every correlation rule, args of each shape, numbers DuckDB spells its own way.
EVENTS = [
    {"name": "process_name", "ph": "M", "ts": EPOCH_US, "pid": 3, "tid": 1000, "args": {"name": "Rank 3 \u00e9\"x\"\\n"}},
    {"name": "clock_sync_timestamp_us", "ph": "M", "ts": EPOCH_US, "pid": 3, "tid": 1000, "args": {"value": EPOCH_US + 5}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 3, "tid": 1001, "ts": EPOCH_US + 10, "dur": 202,
     "args": {"External id": 6, "Input Dims": [[64, 512], [512, 512]], "Input type": ["float", "float"]}},
    {"ph": "X", "name": "float times", "pid": -1, "tid": 7, "ts": 1700000000000020.5, "dur": 3.25, "args": {"correlation": 9, "External id": 4}},
    {"ph": "X", "name": "tiny", "ts": 0.001, "dur": 1e-3},
    {"ph": "i", "name": "a fraction of a ns is dropped", "ts": 2.0007, "s": "t"},
    {"ph": "X", "name": "exponent", "ts": 1.5e3, "dur": 0, "args": {"correlation": "no", "External id": 4}},
    {"ph": "i", "name": "no cat, no pid", "ts": EPOCH_US + 30, "s": "t", "args": {"correlation": True}},
    {"ph": "C", "name": "loss", "cat": "metric", "ts": EPOCH_US + 40, "pid": 3, "tid": 1000,
     "args": {"value": 0.1, "huge": 1e100, "small": 1e-7, "negative zero": -0.0, "big": 12345678901234567890}},
    {"ph": "B", "name": "batch", "cat": "event", "ts": EPOCH_US + 50, "pid": 3, "tid": 1000, "args": {}},
    {"ph": "E", "name": "batch", "cat": "event", "ts": EPOCH_US + 60, "pid": 3, "tid": 1000, "args": []},
    {"ph": "s", "name": "flow", "cat": "ac2g", "id": 77, "ts": EPOCH_US + 51, "pid": 3, "tid": 1001},
    {"ph": "f", "name": "flow", "cat": "ac2g", "id": 77, "ts": EPOCH_US + 55, "pid": 3, "tid": 1001, "bp": "e"},
    {"ph": "X", "name": "an id outside a flow is ignored", "id": "0x1f", "ts": EPOCH_US + 70, "dur": 1, "args": [1, {"a": 2}]},
]


def rows_by_importer(path, rank=None):
    info = scan_trace(path, rank, BatchFile(path.with_suffix(".batches")), batch_events=4)
    with BatchFile(path.with_suffix(".batches")) as batches:
        table = trace_table([("run", r, batch) for r, batch in file_parts(info, batches)])
    return _comparable(table.to_pylist())


def _comparable(rows):
    """Rows as sorted tuples, args compared as JSON values (DuckDB writes 1e100 where Python writes 1e+100)."""
    return sorted((tuple((k, json.loads(v) if k == "args" and v is not None else v) for k, v in sorted(row.items()))
                   for row in rows), key=repr)


def read_by_duckdb(path, rank=None):
    con = duckdb.connect()
    con.execute(ddl())
    info = insert_array_trace(con, path, "run", rank=rank)
    rows = execute_to_arrow(con, "SELECT * FROM trace_events", None).to_pylist()
    return info, rows


def test_the_same_rows_as_the_importer(tmp_path):
    path = tmp_path / "ep0-rank3.json"
    path.write_text(json.dumps(EVENTS, indent=1))
    info, rows = read_by_duckdb(path)
    assert (info.rank, info.events) == (3, len(EVENTS))
    assert _comparable(rows) == rows_by_importer(path)


def test_a_rank_given_wins_over_the_file_name(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(EVENTS[:3]))
    assert read_by_duckdb(path)[0] is None  # no rank anywhere: the importer's pids rule applies
    info, rows = read_by_duckdb(path, rank=5)
    assert info.rank == 5 and {row["rank"] for row in rows} == {5}
    assert _comparable(rows) == rows_by_importer(path, rank=5)


GOOD = {"ph": "X", "name": "op", "ts": 1, "dur": 1, "pid": 0, "tid": 0}
DECLINED = {
    "a null (read like a missing key)": [dict(GOOD, name=None)],
    "empty padding": [GOOD, {}],
    "a ProfilerStep span (steps are the importer's)": [dict(GOOD, name="ProfilerStep#3")],
    "a named pid": [dict(GOOD, pid="Spans")],
    "a float pid": [dict(GOOD, pid=2.0)],
    "a boolean tid": [dict(GOOD, tid=True)],
    "a boolean ts": [dict(GOOD, ts=True)],
    "a string ts": [dict(GOOD, ts="soon")],
    "a negative dur": [dict(GOOD, dur=-1)],
    "a numeric name": [dict(GOOD, name=5)],
    "a numeric cat": [dict(GOOD, cat=1.5)],
    "scalar args": [dict(GOOD, args=0)],
    "a flow with a string id": [dict(GOOD, ph="s", id="0x1")],
    "an unknown phase": [dict(GOOD, ph="Q")],
    "a pid beyond int64": [dict(GOOD, pid=2**63)],
    "a time beyond int64 in ns": [dict(GOOD, ts=2**62)],
}


@pytest.mark.parametrize("events", DECLINED.values(), ids=DECLINED.keys())
def test_what_the_importer_reads_otherwise_is_declined_with_nothing_inserted(tmp_path, events):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps([GOOD] * 3 + events))
    info, rows = read_by_duckdb(path)
    assert info is None and rows == []


def test_a_null_token_is_found_wherever_the_read_blocks_cut_it(tmp_path, monkeypatch):
    import rankstream.producers.trace_sql_reader as reader

    with_null = b'[{"ph": "X", "ts": 1, "args": {"a": [1,  \n \t null]}}]'
    without = b'[{"ph": "X", "ts": 1, "name": "annulled", "args": {"nullable": "nul", "b": [1, 2]}}]'
    (tmp_path / "with.json").write_bytes(with_null)
    (tmp_path / "without.json").write_bytes(without)
    for block in range(1, len(without) + 1):
        monkeypatch.setattr(reader, "_SCAN_BYTES", block)
        with open(tmp_path / "with.json", "rb") as found, open(tmp_path / "without.json", "rb") as clean:
            assert reader._may_hold_null_token(found) and not reader._may_hold_null_token(clean), block


def test_an_empty_array_is_declined_and_left_to_the_importer_to_refuse(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_text("[\n]\n")
    assert read_by_duckdb(path) == (None, [])


@pytest.mark.parametrize("kind", ["unterminated", "object", "gzip"])
def test_files_that_are_not_plain_arrays_are_declined(tmp_path, kind):
    text = json.dumps([GOOD] * 3)
    path = tmp_path / "rank0.json"
    if kind == "unterminated":
        path.write_text(text[:-1] + ",\n")
    elif kind == "object":
        path.write_text(json.dumps({"traceEvents": [GOOD] * 3, "baseTimeNanoseconds": 5}))
    else:
        path = tmp_path / "rank0.json.gz"
        path.write_bytes(gzip.compress(text.encode()))
    assert read_by_duckdb(path) == (None, [])
    assert scan_trace(path).events == 3  # the importer reads each of them


HOSTILE = {
    "elements that are not objects": b'[{"ph": "X", "ts": 1}, [1, 2], 3]',
    "invalid UTF-8": b'[{"ph": "X", "ts": 1, "name": "\xff\xfe"}]',
    "truncated inside an event": b'[{"ph": "X", "ts": 1}, {"ph": "X", "ts": ]',
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_text_duckdb_cannot_read_is_declined_with_nothing_inserted(tmp_path, text):
    path = tmp_path / "rank0.json"
    path.write_bytes(text)
    assert read_by_duckdb(path) == (None, [])


def test_args_nested_deeper_than_python_recurses_are_read_where_the_importer_refuses_in_one_line(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_bytes(b'[{"ph": "X", "ts": 1, "args": ' + b'[' * 5000 + b'1' + b']' * 5000 + b'}]')
    info, rows = read_by_duckdb(path)
    assert info.events == 1 and rows[0]["args"] == "[" * 5000 + "1" + "]" * 5000
    # the byte where the nesting passes orjson's 1,024 levels (it said "RecursionError", with no byte)
    with pytest.raises(BadInput, match=r"rank0.json: not readable as a Chrome trace: at byte 1,053: depth limit"):
        scan_trace(path, None, BatchFile(tmp_path / "batches"))
