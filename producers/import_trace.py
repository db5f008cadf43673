"""``rankstream import trace FILE...``: Chrome-format trace files into the bus.

Accepts Kineto / torch.profiler exports (``{"traceEvents": [...], "baseTimeNanoseconds": ...,
"distributedInfo": {...}}``), Composer's per-rank and merged traces, generic Chrome arrays and
objects, gzip-compressed files (``.json.gz``), and arrays that were never terminated (a trace
written by a process that died). Files are parsed as streams (ijson), never loaded whole.

Each file is read twice: a first pass checks every event and collects what the second pass needs
(the ``ProfilerStep#N`` spans that give each event its step, the base time, the rank); only if
the first pass succeeds does the second pass publish. So a bad file is reported with its name and
imports nothing.

Timestamps: Chrome ``ts``/``dur`` are microseconds; Kineto's ``ts`` is relative to
``baseTimeNanoseconds``, Composer's is epoch time. Both become epoch nanoseconds. The rank comes
from ``--rank``, else ``distributedInfo.rank``, else the file name (``rank3``, ``rank_3``,
``rank-3``), else each event's ``pid`` (Composer's merged traces set pid to the global rank).
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import ijson

from rankstream.config import Config
from rankstream.errors import BadInput
from rankstream.producers.importing import (
    ImportSummary,
    check_input_file,
    content_session_id,
    publish_ranks,
    wait_for_room,
    wait_materialized,
)

__all__ = ["TraceFile", "scan_trace", "import_traces"]

_RANK_IN_NAME = re.compile(r"rank[_\-]?(\d+)", re.IGNORECASE)
_STEP = re.compile(r"ProfilerStep#(\d+)$")
_EDGE_BYTES = 1 << 18
_PHASES = set("BEXiICMsftbnePONDRcVv()")


class _Recorder:
    """A binary reader that remembers the first and last bytes it passed on, and terminates
    an array the writer never closed (adding ``{}]`` after a trailing comma, ``]`` otherwise)."""

    def __init__(self, raw) -> None:
        self._raw = raw
        self.head = b""
        self.tail = b""
        self._top: bytes | None = None
        self._closed = False

    def read(self, size: int = -1) -> bytes:
        if size == 0:
            return b""
        data = self._raw.read(size)
        if data:
            if len(self.head) < _EDGE_BYTES:
                self.head += data[:_EDGE_BYTES - len(self.head)]
            self.tail = (self.tail + data)[-_EDGE_BYTES:]
            if self._top is None and data.strip():
                self._top = data.lstrip()[:1]
            return data
        if self._top == b"[" and not self._closed:
            self._closed = True
            ending = self.tail.rstrip()
            if not ending.endswith(b"]"):
                return b"{}]" if ending.endswith(b",") else b"]"
        return b""


def _open(path: Path):
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rb")
        return open(path, "rb")
    except OSError as exc:
        raise BadInput(f"{path}: cannot open: {exc.strerror}") from None


def _events(path: Path, recorder: _Recorder) -> Iterator[dict]:
    first = recorder.read(1)
    while first and first.isspace():
        first = recorder.read(1)
    prefix = {b"{": "traceEvents.item", b"[": "item"}.get(first)
    if prefix is None:
        raise BadInput(f"{path}: not a Chrome trace (expected a JSON object or array)")
    stream = _Prepend(first, recorder)
    yield from ijson.items(stream, prefix, use_float=True)


class _Prepend:
    def __init__(self, first: bytes, raw) -> None:
        self._first, self._raw = first, raw

    def read(self, size: int = -1) -> bytes:
        if size == 0:  # ijson probes read(0) to tell bytes from text
            return b""
        if self._first:
            first, self._first = self._first, b""
            return first + self._raw.read(max(size - 1, 0) if size > 0 else -1)
        return self._raw.read(size)


def _metadata(path: Path, head: bytes, tail: bytes) -> tuple[int, dict | None]:
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


def _int(value: Any) -> int:
    """pid/tid: integers as they are; names (Kineto's "Spans", "Traces") as a stable number."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return (1 << 40) + zlib.crc32(str(value).encode())


@dataclass
class TraceFile:
    """What the first pass learned about one file."""

    path: Path
    events: int = 0
    base_ns: int = 0
    rank: int | None = None
    world_size: int | None = None
    ranks_from_pid: bool = False
    steps: dict[int, tuple[list[int], list[int], list[int]]] = field(default_factory=dict)
    #: Integer pids seen: the ranks of a merged trace.
    pids: set[int] = field(default_factory=set)
    session_id: str = ""


def _check_event(path: Path, index: int, event: Any) -> bool:
    """True for an event to import, False for one to skip ({} padding); raises on a bad one."""
    if not isinstance(event, dict):
        raise BadInput(f"{path}: event {index} is not a JSON object")
    if not event:
        return False
    if not isinstance(event.get("ph"), str) or event["ph"] not in _PHASES:
        raise BadInput(f"{path}: event {index} has no valid 'ph' phase ({event.get('ph')!r})")
    ts = event.get("ts", 0)
    if not isinstance(ts, (int, float)) or ts != ts:
        raise BadInput(f"{path}: event {index} has a non-numeric 'ts' ({ts!r})")
    duration = event.get("dur", 0)
    if not isinstance(duration, (int, float)) or duration < 0:
        raise BadInput(f"{path}: event {index} has a negative or non-numeric 'dur' ({duration!r})")
    return True


def scan_trace(path: Path, rank: int | None = None) -> TraceFile:
    """First pass: check every event, find the rank, the base time and the step spans."""
    check_input_file(path)
    info = TraceFile(path=path)
    spans: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    pids: set = set()
    digest = zlib.crc32(b"")
    with _open(path) as raw:
        recorder = _Recorder(raw)
        try:
            for index, event in enumerate(_events(path, recorder)):
                if not _check_event(path, index, event):
                    continue
                info.events += 1
                pids.add(event.get("pid"))
                name = event.get("name")
                if isinstance(name, str) and event["ph"] == "X" and (match := _STEP.match(name)):
                    start = int(event["ts"] * 1000)
                    spans[_int(event.get("pid"))].append((start, start + int(event.get("dur", 0) * 1000),
                                                          int(match.group(1))))
        except (ijson.JSONError, ValueError, OSError, EOFError, zlib.error) as exc:
            reason = (str(exc).strip().splitlines() or [""])[0]
            raise BadInput(f"{path}: not readable as a Chrome trace: {type(exc).__name__}: {reason}"[:400]) from None
        digest = zlib.crc32(recorder.head + recorder.tail, digest)
    if info.events == 0:
        raise BadInput(f"{path}: contains no trace events")
    info.pids = {p for p in pids if isinstance(p, int) and not isinstance(p, bool)}
    info.base_ns, distributed = _metadata(path, recorder.head, recorder.tail)
    info.rank = rank
    if info.rank is None and distributed and isinstance(distributed.get("rank"), int):
        info.rank = distributed["rank"]
        info.world_size = distributed.get("world_size") if isinstance(distributed.get("world_size"), int) else None
    if info.rank is None and (match := _RANK_IN_NAME.search(path.name)):
        info.rank = int(match.group(1))
    if info.rank is None:
        if not all(isinstance(p, int) and 0 <= p < 1 << 16 for p in pids if p is not None):
            raise BadInput(f"{path}: cannot tell the rank (no distributedInfo, no rank in the file name, "
                           "pids are not ranks); pass --rank")
        info.ranks_from_pid = True
    for pid, found in spans.items():
        found.sort()
        info.steps[pid] = ([s[0] for s in found], [s[1] for s in found], [s[2] for s in found])
    info.session_id = content_session_id(path.name, str(path.stat().st_size), str(digest))
    return info


def _step_of(steps, ts_ns: int) -> int | None:
    if not steps:
        return None
    starts, ends, numbers = steps
    i = bisect.bisect_right(starts, ts_ns) - 1
    return numbers[i] if i >= 0 and ts_ns < ends[i] else None


def _emit_events(info: TraceFile, producers: dict) -> dict[int, int]:
    """Second pass: publish the file's events; a merged trace goes to the producer of each pid."""
    counts = dict.fromkeys(producers, 0)
    single = None if info.ranks_from_pid else producers[info.rank]
    all_steps = list(info.steps.values())
    with _open(info.path) as raw:
        for event in _events(info.path, _Recorder(raw)):
            if not event:
                continue
            pid = _int(event.get("pid", 0))
            producer = single or producers.get(pid)
            if producer is None:
                continue
            relative_ns = int(event.get("ts", 0) * 1000)
            steps = info.steps.get(pid) or (all_steps[0] if len(all_steps) == 1 else None)
            args = event.get("args")
            correlation = None
            if isinstance(args, dict):
                correlation = args.get("correlation", args.get("External id"))
                correlation = correlation if isinstance(correlation, int) else None
            flow = event.get("id") if event["ph"] in "stf" else None
            producer.emit(str(event.get("name", "")), str(event.get("cat", "")), event["ph"],
                          info.base_ns + relative_ns, int(event.get("dur", 0) * 1000), pid,
                          _int(event.get("tid", 0)), _step_of(steps, relative_ns),
                          _int(flow) if flow is not None else None, correlation,
                          json.dumps(args, separators=(",", ":")) if args else None)
            counts[producer.rank] += 1
            if counts[producer.rank] % 5000 == 0:
                wait_for_room(producer)
    return counts


def import_traces(config: Config, paths: list[Path], *, run_id: str | None = None, rank: int | None = None,
                  wait: bool = True) -> ImportSummary:
    if rank is not None and len(paths) > 1:
        raise BadInput("--rank applies to one file; name the rank in each file name instead")
    scanned = [scan_trace(path, rank) for path in paths]
    ranks = {s.rank for s in scanned if s.rank is not None} | {p for s in scanned if s.ranks_from_pid for p in s.pids}
    world_size = max([len(paths)] + [r + 1 for r in ranks] + [s.world_size or 0 for s in scanned])
    summary = ImportSummary(run_id=run_id or f"trace-{scanned[0].path.name.split('.')[0]}")
    for info in scanned:
        targets = sorted(info.pids) if info.ranks_from_pid else [info.rank]
        publish_ranks(config, summary.run_id, targets, world_size, info.session_id,
                      lambda producers, info=info: _emit_events(info, producers), summary)
    if wait:
        wait_materialized(config, summary)
    return summary
