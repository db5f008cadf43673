"""Reading a Chrome-format trace file as a stream of event chunks, never loading it whole.

Accepts a JSON array of events or an object with a ``traceEvents`` array (Kineto writes its
metadata around it), plain or gzip-compressed, and arrays a dying writer never closed.

Two readers give the same events. The fast one cuts the text of the events array into slices of
about a MB where an element seems to end (``}``, ``,``, ``{``) and parses each slice with orjson:
0.5 s for a 36 MB file, where ijson's event-by-event parse takes 1.8 s. Whether a cut really fell between
two top-level elements is never guessed: a cut inside a string or a nested object leaves a slice
that does not parse, and the reader tries an earlier cut. Whatever the fast reader cannot place
(no ``traceEvents`` key near the start, a giant single-line event, invalid JSON) it hands, from
where it stopped, to ijson, which reads the rest. When ijson fails, the text is read again from the
last element that parsed to name the byte where it goes wrong (``json_position``). Parsing runs
with the garbage collector paused: the thousands of fresh dicts of each slice otherwise set off
collections that cost as much as the parse, and parsed JSON holds no reference cycles.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import ijson
import orjson

from rankstream.schemas.errors import BadInput
from rankstream.producers.importing import paused_gc
from rankstream.producers.json_position import first_problem_in_stream

__all__ = ["CHUNK_BYTES", "EDGE_BYTES", "Recorder", "open_trace", "event_chunks", "read_metadata", "broken_json",
           "unreadable"]

#: Text parsed at once by the fast reader: large enough to amortise the cut search, small enough
#: that a slice's parsed events (many times the text as Python objects) stay small. Larger
#: slices were no faster and took more memory (docs/benchmarks.md).
CHUNK_BYTES = 1 << 20
EDGE_BYTES = 1 << 18
#: Where to look for the last cut of a slice: the tail of the buffer, widened if it has none.
_CUT_WINDOW = 1 << 16
#: Cuts tried (latest first) before a slice goes to ijson.
_CUT_TRIES = 16
_SLOW_CHUNK_EVENTS = 5000
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


class Recorder:
    """A binary reader that remembers the first and last bytes it passed on, and terminates
    an array the writer never closed (adding ``{}]`` after a trailing comma, ``]`` otherwise)."""

    def __init__(self, raw) -> None:
        self._raw = raw
        self.head = b""
        self.tail = b""
        #: Bytes passed on so far (the padding included, which only ever comes last).
        self.passed = 0
        self._top: bytes | None = None
        self._closed = False

    def read(self, size: int = -1) -> bytes:
        if size == 0:
            return b""
        data = self._raw.read(size)
        self.passed += len(data)
        if data:
            if len(self.head) < EDGE_BYTES:
                self.head += data[:EDGE_BYTES - len(self.head)]
            self.tail = (self.tail + data)[-EDGE_BYTES:]
            if self._top is None and data.strip():
                self._top = data.lstrip()[:1]
            return data
        if self._top == b"[" and not self._closed:
            self._closed = True
            ending = self.tail.rstrip()
            if not ending.endswith(b"]"):
                padding = b"{}]" if ending.endswith(b",") else b"]"
                self.passed += len(padding)
                return padding
        return b""

    def reread_from(self, offset: int):
        """The underlying file, placed at ``offset`` (of the decompressed text, for gzip)."""
        self._raw.seek(offset)
        return self._raw


def open_trace(path: Path):
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rb")
        return open(path, "rb")
    except OSError as exc:
        raise BadInput(f"{path}: cannot open: {exc.strerror}") from None


def event_chunks(path: Path, source: Recorder, chunk_bytes: int = CHUNK_BYTES) -> Iterator[list]:
    """The file's events, in order, as lists (``{}`` padding included; the caller skips it).

    The garbage collector stays paused until the iteration ends, including while the caller
    works on a chunk: its objects are then freed before the collector counts them.
    Raises ``BadInput`` when the file is neither a JSON array nor an object or its JSON is broken
    (naming the byte where), and the decompressor's errors when the gzip stream is broken."""
    with paused_gc():
        yield from _chunks(path, source, chunk_bytes)


def _chunks(path: Path, source: Recorder, chunk_bytes: int) -> Iterator[list]:
    buffer = source.read(chunk_bytes)
    start = len(buffer) - len(buffer.lstrip())
    top = buffer[start:start + 1]
    if top == b"[":
        items, begin = "item", start + 1
    elif top == b"{":
        items, begin = "traceEvents.item", _events_array_start(buffer)
    else:
        raise BadInput(f"{path}: not a Chrome trace (expected a JSON object or array)")
    if begin is None:  # the key is not near the start: only a full parser can find it
        yield from _slow_chunks(path, buffer, source, items, _Restart(0, b""))
        return
    prefix, position, at_end, wanted = buffer[:begin], begin, False, chunk_bytes
    while True:
        if not at_end and len(buffer) - position < wanted:
            block = source.read(chunk_bytes)
            at_end = not block
            buffer, position = buffer[position:] + block, 0
            continue
        parsed = _parse_rest(buffer, position, top) if at_end else _parse_slice(buffer, position)
        if parsed is None:
            if not at_end and wanted < 4 * chunk_bytes:  # no cut that parses yet: try more text
                wanted *= 2
                continue
            restart = _Restart(source.passed - len(buffer) + position, b"[" if top == b"[" else b'{"_":[')
            yield from _slow_chunks(path, prefix + buffer[position:], source, items, restart)
            return
        events, position = parsed
        wanted = chunk_bytes
        if events:
            yield events
        if at_end:
            return


def _events_array_start(head: bytes) -> int | None:
    """Offset just after ``"traceEvents": [`` when that key is a top-level key of the object
    (checked by parsing everything before it as an object's beginning), else None."""
    for match in _EVENTS_KEY.finditer(head):
        before = head[:match.start()].rstrip()
        closing = b'"_":0}' if before.endswith((b"{", b",")) else b"}"
        if _parses(before + closing):
            return match.end()
    return None


def _parse_slice(buffer: bytes, position: int) -> tuple[list, int] | None:
    """Parse the complete elements of ``buffer[position:]`` up to its last cut that parses;
    returns (events, where the next element starts), or None if no cut worked."""
    window = max(position, len(buffer) - _CUT_WINDOW)
    cuts = [m.start() for m in _BOUNDARY.finditer(buffer, window)] or \
        [m.start() for m in _BOUNDARY.finditer(buffer, position)]
    for cut in reversed(cuts[-_CUT_TRIES:]):
        events = _parse_elements(buffer[position:cut + 1])
        if events is not None:
            return events, buffer.index(b"{", cut + 1)
    return None


def _parse_rest(buffer: bytes, position: int, top: bytes) -> tuple[list, int] | None:
    """The last elements, up to the ``]`` that closes the events array. What follows it must be
    whitespace (an array) or the rest of the object's keys; candidates are tried from the end."""
    end = len(buffer)
    for _ in range(_CUT_TRIES):
        end = buffer.rfind(b"]", position, end)
        if end < 0:
            return None
        after = buffer[end + 1:]
        closes = not after.strip() if top == b"[" else _parses(b'{"_":0' + after)
        if closes:
            events = _parse_elements(buffer[position:end])
            if events is not None:
                return events, len(buffer)
    return None


def _parse_elements(text: bytes) -> list | None:
    try:
        return orjson.loads(b"[" + text + b"]")
    except orjson.JSONDecodeError:
        return None


def _parses(text: bytes) -> bool:
    try:
        orjson.loads(text)
        return True
    except orjson.JSONDecodeError:
        return False


@dataclass(frozen=True)
class _Restart:
    """Where the slow reader's text resumes the file: the byte offset of its first unread event,
    and what turns the text from there into a document of its own (``[`` for the rest of an
    array's elements; nothing at the file's beginning)."""

    offset: int
    lead: bytes


def _slow_chunks(path: Path, start: bytes, source: Recorder, items: str, restart: _Restart) -> Iterator[list]:
    """ijson over ``start`` and then the rest of ``source``; ``start`` begins with the document's
    own beginning, up to and including the events array's ``[`` and any events not yet read."""
    chunk: list = []
    try:
        for event in ijson.items(_Prepend(start, source), items, use_float=True):
            chunk.append(event)
            if len(chunk) == _SLOW_CHUNK_EVENTS:
                yield chunk
                chunk = []
    except (ijson.JSONError, RecursionError, UnicodeDecodeError) as exc:
        raise _located(path, source, restart) or exc from None
    if source.tail.rstrip()[-1:] not in (b"]", b"}", b","):  # ijson takes an unclosed string after the end
        raise _located(path, source, restart) or BadInput(f"{path}: not readable as a Chrome trace: trailing text")
    if chunk:
        yield chunk


def _located(path: Path, source: Recorder, restart: _Restart) -> BadInput | None:
    """The error naming the byte where the text goes wrong, found by reading it again from
    ``restart``; None if that finds nothing wrong."""
    try:
        problem = broken_json(path, source.reread_from(restart.offset), restart)
    except (OSError, ValueError):  # a source that cannot seek: the parser's own error stands
        return None
    return None if problem is None else BadInput(f"{path}: {problem}")


def broken_json(path: Path, raw, restart: _Restart = _Restart(0, b"")) -> str | None:
    """``not readable as a Chrome trace: at byte N: what`` for the text ``raw`` holds from
    ``restart`` on (``check-trace`` says it in the importer's words); None if it parses."""
    problem = first_problem_in_stream(raw, restart.lead)
    if problem is None:
        return None
    of = " of the decompressed text" if path.suffix == ".gz" else ""
    return f"not readable as a Chrome trace: {problem.describe(restart.offset, of)}"


def unreadable(path: Path, exc: BaseException) -> str:
    """``not readable ...`` for a file whose text a parser or an encoder gave up on (``exc``): the
    byte where the JSON first goes wrong, found by reading the file again (nesting deeper than
    orjson's 1,024 levels counts); the exception's own words if the text parses."""
    try:
        with open_trace(path) as raw:
            problem = broken_json(path, raw)
    except (OSError, EOFError, ValueError):
        problem = None
    reason = (str(exc).strip().splitlines() or [""])[0]
    return problem or f"not readable as a Chrome trace: {type(exc).__name__}: {reason}"[:300]


class _Prepend:
    """A reader that returns ``first`` and then what ``raw`` has."""

    def __init__(self, first: bytes, raw) -> None:
        self._first, self._raw = first, raw

    def read(self, size: int = -1) -> bytes:
        if size == 0:  # ijson probes read(0) to tell bytes from text
            return b""
        if self._first:
            if size < 0:
                first, self._first = self._first + self._raw.read(), b""
                return first
            first, self._first = self._first[:size], self._first[size:]
            return first
        return self._raw.read(size)


def read_metadata(head: bytes, tail: bytes) -> tuple[int, dict | None]:
    """``baseTimeNanoseconds`` and ``distributedInfo`` from the top level (Kineto writes them
    first; other writers may put them last), without loading the file."""
    base, info = 0, None
    decoder = json.JSONDecoder()
    for edge in (head, tail):
        text = edge.decode("utf-8", "replace")
        match = re.search(r'"baseTimeNanoseconds"\s*:\s*(\d+)', text)
        if match and not base:
            base = int(match.group(1))
        match = re.search(r'"distributedInfo"\s*:\s*', text)
        if match and info is None:
            try:
                info, _ = decoder.raw_decode(text, match.end())
            except ValueError:
                info = None
    return base, info if isinstance(info, dict) else None
