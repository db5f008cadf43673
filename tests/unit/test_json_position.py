"""Parse errors name the byte where the text goes wrong, whether the file is read whole (dumps) or
in chunks (traces), compressed or not, and however far into it the problem is."""

import gzip
import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankstream.producers import json_position
from rankstream.producers.fr_reader import parse_dump
from rankstream.producers.json_position import first_problem, first_problem_in_stream
from rankstream.producers.trace_reader import Recorder, event_chunks
from rankstream.schemas.errors import BadInput


def offset_in(message: str) -> int:
    return int(message.split("at byte ", 1)[1].split(":")[0].split(" ")[0].replace(",", ""))


@pytest.mark.parametrize("text,at,what", [
    (b'[1, 2 x]', 6, "expected ',' or ']'"),
    ('["\u00e9\u00e9" x]'.encode(), 8, "expected ',' or ']'"),      # two 2-byte characters before it
    (b'[1, "\xff"]', 5, "not UTF-8"),
    (b'[1, x, "\xff"]', 4, "expected a JSON value"),                # the syntax error comes first
    (b'{"a": [1, 2', 11, "unexpected end of data"),
    (b'[' * 2000, 1025, "depth limit exceeded"),
    (b'{"a": 1} trailing', 9, "unexpected content after document"),
])
def test_the_first_problem_is_named_by_its_byte_offset(text, at, what):
    problem = first_problem(text)
    assert problem.offset == at and what in problem.what


def test_a_valid_document_has_no_problem():
    assert first_problem(json.dumps({"a": ["é", 1.5, None]}).encode()) is None


def test_the_stream_search_widens_its_window_only_while_the_text_ends_too_early(monkeypatch):
    monkeypatch.setattr(json_position, "FIRST_WINDOW", 16)
    body = b'{"name": "\xc3\xa9"},' * 500                # windows end inside the 2-byte character too
    bad = body + b'{"name" 1}]'
    problem = first_problem_in_stream(io.BytesIO(bad), b"[")
    assert problem.offset == bad.index(b' 1}]') + 1 and not problem.truncated
    cut = first_problem_in_stream(io.BytesIO(body + b'{"name":'), b"[")
    assert (cut.offset, cut.truncated) == (len(body) + len(b'{"name":'), True)
    assert first_problem_in_stream(io.BytesIO(body + b"{}]"), b"[") is None


def read_all(path: Path, raw, chunk_bytes: int) -> list:
    return [event for chunk in event_chunks(path, Recorder(raw), chunk_bytes) for event in chunk]


EVENTS = [{"ph": "X", "name": f"op{i}", "ts": i, "dur": 1, "args": {"s": "}, {"}} for i in range(3000)]


@pytest.mark.parametrize("chunk_bytes", [4096, 1 << 20])
@pytest.mark.parametrize("form", ["array", "object"])
def test_a_trace_broken_deep_inside_names_the_byte(tmp_path, chunk_bytes, form):
    text = json.dumps(EVENTS if form == "array" else {"traceEvents": EVENTS, "traceName": "t"}).encode()
    colon = text.index(b'"op2500"') - 2
    broken = text[:colon] + text[colon + 1:]                  # '{"ph": "X", "name" "op2500"'
    at = colon + 1                                            # where a colon was expected
    path = tmp_path / "rank0.json"
    path.write_bytes(broken)
    with open(path, "rb") as raw, pytest.raises(BadInput) as error:
        read_all(path, raw, chunk_bytes)
    message = str(error.value)
    assert message.startswith(f"{path}: not readable as a Chrome trace: at byte ") and "\n" not in message
    assert offset_in(message) == at == first_problem(broken).offset


def test_a_compressed_trace_names_the_byte_of_its_decompressed_text(tmp_path):
    text = json.dumps({"traceEvents": EVENTS}).encode()
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(text[:-700]))
    with gzip.open(path, "rb") as raw, pytest.raises(BadInput) as error:
        read_all(path, raw, 4096)
    assert f"at byte {len(text) - 700:,} of the decompressed text: unexpected end of data" in str(error.value)


CORRUPTIONS = st.sampled_from([b"#", b",", b"}", b'"', b"]"])


@settings(max_examples=120, deadline=None)
@given(count=st.integers(1, 300), where=st.floats(0, 1), junk=CORRUPTIONS,
       form=st.sampled_from(["array", "object"]), chunk_bytes=st.sampled_from([64, 700, 1 << 20]))
def test_the_streamed_offset_is_the_whole_document_parse(count, where, junk, form, chunk_bytes):
    """Wherever a byte is inserted, the chunked reader fails exactly where one parse of the whole
    text does (or reads every event, when the insertion fell inside a string)."""
    events = EVENTS[:count]
    text = json.dumps(events if form == "array" else {"traceEvents": events}).encode()
    cut = max(1, int(where * len(text)))
    damaged = text[:cut] + junk + text[cut:]  # never at 0: a first byte that is not [ or { is "not a trace"
    expected = first_problem(damaged)
    path = Path("t.json")
    if expected is None:
        whole = json.loads(damaged)
        assert [e for e in read_all(path, io.BytesIO(damaged), chunk_bytes) if e] == \
            (whole if form == "array" else whole.get("traceEvents", []))
        return
    with pytest.raises(BadInput) as error:
        read_all(path, io.BytesIO(damaged), chunk_bytes)
    assert offset_in(str(error.value)) == expected.offset


def test_a_json_flight_recorder_dump_names_the_byte():
    raw = json.dumps({"version": "2.10", "entries": [{"record_id": 0}]}).encode()
    broken = raw.replace(b'"record_id": 0', b'"record_id": 0,')
    with pytest.raises(BadInput) as error:
        parse_dump(broken, "rank_0")
    assert str(error.value) == f"rank_0: not valid JSON at byte {broken.index(b',}'):,}: " \
                               + first_problem(broken).what


def test_past_its_largest_window_the_search_gives_up_rather_than_load_the_file(monkeypatch):
    monkeypatch.setattr(json_position, "FIRST_WINDOW", 16)
    monkeypatch.setattr(json_position, "MAX_WINDOW", 64)
    text = b'{"name": "op"},' * 20 + b'{"name" 1}]'
    assert first_problem_in_stream(io.BytesIO(text), b"[") is None
    monkeypatch.setattr(json_position, "MAX_WINDOW", 1024)
    assert first_problem_in_stream(io.BytesIO(text), b"[").offset == text.index(b" 1}]") + 1


def test_check_trace_names_the_same_byte_as_the_importer_in_one_line(tmp_path):
    from rankstream.flows.chrome_trace import check_chrome_trace
    from rankstream.producers.import_trace import scan_trace

    path = tmp_path / "rank0.json"
    path.write_bytes('[{"ph": "X", "ts": 1, "dur": 1, "name": "é" "a"}]'.encode())
    problems, _ = check_chrome_trace(path)
    with pytest.raises(BadInput) as error:
        scan_trace(path)
    assert problems == [str(error.value).split(": ", 1)[1]] == [
        "not readable as a Chrome trace: at byte 45: unexpected character, expected ',' or '}'"]
    deep = tmp_path / "deep.json"  # Python's json module used to raise RecursionError through the CLI
    deep.write_bytes(b'[{"ph": "X", "ts": 1, "args": ' + b"[" * 5000 + b"1" + b"]" * 5000 + b"}]")
    problems, _ = check_chrome_trace(deep)
    assert len(problems) == 1 and problems[0].endswith("depth limit exceeded")


def test_args_nested_past_the_parser_limit_get_the_same_line_from_import_and_check_trace(tmp_path):
    # ijson reads any depth, so the importer met the nesting only when it encoded the args, and
    # said "RecursionError" with no byte while check-trace named one.
    from rankstream.flows.chrome_trace import check_chrome_trace
    from rankstream.producers.batch_file import BatchFile
    from rankstream.producers.import_trace import scan_trace

    deep = b'{"a": ' * 5000 + b"1" + b"}" * 5000
    path = tmp_path / "rank0.json"
    path.write_bytes(b'[{"name": "op", "ph": "X", "ts": 1, "dur": 1, "pid": 1, "tid": 1},'
                     b' {"name": "op", "ph": "X", "ts": 2, "dur": 1, "pid": 1, "tid": 1, "args": ' + deep + b"}]")
    problems, _ = check_chrome_trace(path)
    with pytest.raises(BadInput) as error, BatchFile(tmp_path / "batches") as batches:
        scan_trace(path, batches=batches)  # converting the events into batches encodes their args
    assert str(error.value) == f"{path}: {problems[0]}"
    assert offset_in(problems[0]) == first_problem(path.read_bytes()).offset
    assert problems[0].endswith("depth limit exceeded")
