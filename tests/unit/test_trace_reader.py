"""The chunked trace reader returns exactly the events a full JSON parse finds, whatever the
layout, the strings inside the events and where the chunks fall."""

import gzip
import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankstream.schemas.errors import BadInput
from rankstream.producers import trace_reader
from rankstream.producers.trace_reader import Recorder, event_chunks

#: Text that looks like an element boundary or the end of the array when it sits inside a string.
TRICKY_TEXT = st.sampled_from(["}, {", "},{", "}]", "]", "\\", '"', "{}]", "aten::mm", "é", "\n"])
ARGS = st.recursive(
    st.none() | st.integers(-2**62, 2**62) | st.floats(allow_nan=False, allow_infinity=False) | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
    max_leaves=6,
)
EVENT = st.fixed_dictionaries(
    {"ph": st.sampled_from("XBEiC"), "name": st.text(max_size=8) | TRICKY_TEXT, "ts": st.integers(0, 2**50)},
    optional={"args": ARGS, "dur": st.floats(0, 1e6)},
)


def read(text: bytes, chunk_bytes: int) -> list:
    return [event for chunk in event_chunks(Path("t.json"), Recorder(io.BytesIO(text)), chunk_bytes)
            for event in chunk]


@settings(max_examples=150, deadline=None)
@given(events=st.lists(EVENT, max_size=30), indent=st.sampled_from([None, 0, 2]),
       form=st.sampled_from(["array", "object", "object with metadata after"]),
       chunk_bytes=st.sampled_from([8, 64, 300, 1 << 20]))
def test_chunks_hold_exactly_the_parsed_events(events, indent, form, chunk_bytes):
    if form == "array":
        document = events
    elif form == "object":
        document = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "]}"}], "traceEvents": events}
    else:
        document = {"traceEvents": events, "deviceProperties": [{"id": [0]}], "traceName": "x]"}
    text = json.dumps(document, indent=indent, ensure_ascii=False).encode()
    assert read(text, chunk_bytes) == events


def test_the_fast_reader_does_the_work_on_a_plain_trace(monkeypatch):
    """A well-formed file never reaches ijson (which is several times slower)."""
    monkeypatch.setattr(trace_reader, "_slow_chunks", lambda *args: pytest.fail("fell back to ijson"))
    events = [{"ph": "X", "name": f"op{i}", "ts": i, "dur": 1, "args": {"l": [{"a": 1}, {"b": 2}]}}
              for i in range(2000)]
    for indent in (None, 2):
        text = json.dumps({"traceEvents": events, "baseTimeNanoseconds": 5}, indent=indent).encode()
        chunks = list(event_chunks(Path("t.json"), Recorder(io.BytesIO(text)), 4096))
        assert len(chunks) > 10 and [e for c in chunks for e in c] == events


def test_unterminated_arrays_and_gzip(tmp_path):
    events = [{"ph": "X", "name": "a", "ts": i} for i in range(50)]
    text = json.dumps(events)[:-1]
    for ending in ("", ",\n"):
        assert [e for e in read((text + ending).encode(), 64) if e] == events
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    with trace_reader.open_trace(path) as raw:
        assert [e for c in event_chunks(path, Recorder(raw), 64) for e in c] == events


@pytest.mark.parametrize("text,at,what", [
    (b'{"traceEvents": [{"ph": "X", "ts": 1}, {"ph": "X", "ts": 2}', 59, "unexpected end of data"),  # cut short
    (b'[{"ph": "X", "ts": 1}, {"ph": "X" "ts": 2}]', 34, "expected ',' or '}'"),                  # missing comma
    (b'{"traceEvents": [{"ph": "X", "ts": 1}]} trailing', 40, "unexpected content after document"),
    (b'[{"ph": "X", "ts": 1}]"', 22, "unexpected content after document"),  # ijson alone takes this one
])
def test_broken_json_is_bad_input_naming_the_byte(text, at, what):
    for chunk_bytes in (16, 1 << 20):
        with pytest.raises(BadInput, match=f"^t.json: not readable as a Chrome trace: at byte {at}: .*{what}"):
            read(text, chunk_bytes)


def test_a_file_that_is_no_json_container_is_bad_input():
    with pytest.raises(BadInput, match="not a Chrome trace"):
        read(b"  \x00garbage", 16)
