"""Reading Chrome-format trace files for ``rankstream import trace`` and ``rankstream merge``.

Accepts Kineto / torch.profiler exports (``{"traceEvents": [...], "baseTimeNanoseconds": ...,
"distributedInfo": {...}}``), Composer's per-rank and merged traces, generic Chrome arrays and
objects, gzip-compressed files (``.json.gz``), and arrays that were never terminated (a trace
written by a process that died). Files are read as a stream of event chunks
(``trace_reader``), never loaded whole, and published as whole batches (``trace_columns``).

Each file is parsed once. The first pass checks every event, converts it into batches that wait
in a temporary file (``BatchFile``), and collects what only the whole file tells: the
``ProfilerStep#N`` spans that give each event its step, the base time, the rank. Only when every
file has passed does the second pass give the batches their absolute times and steps and publish
them (``producers.publish``). So a bad file is reported with its name and imports nothing.

Timestamps: Chrome ``ts``/``dur`` are microseconds; Kineto's ``ts`` is relative to
``baseTimeNanoseconds``, Composer's is epoch time. Both become epoch nanoseconds. The rank comes
from ``--rank``, else ``distributedInfo.rank``, else the file name (``rank3``, ``rank_3``,
``rank-3``), else each event's ``pid`` (Composer's merged traces set pid to the global rank).

A merged Composer trace has its ranks on one clock already: Composer's merger shifts every event by
the clock-sync readings, but leaves the ``clock_sync_timestamp_us`` / ``clock_sync_error_bound``
metadata as the ranks recorded them. Imported as they are, rankstream's merge would apply the same
offsets a second time, so a file whose ranks come from its pids is imported without them.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import threading
import zlib
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import ijson
import numpy as np

from rankstream.schemas.errors import BadInput, RankstreamError
from rankstream.producers.importing import check_input_file, content_session_id, item_as_json
from rankstream.producers.batch_file import BatchFile
from rankstream.producers.trace_columns import (Steps, as_int, event_columns, finish_batch, step_number, steps_by_pid,
                                                trace_batches)
from rankstream.producers.trace_reader import Recorder, event_chunks, open_trace, read_metadata, unreadable
from rankstream.producers.trace_validation import CHROME_PHASES, checked_chunk
from rankstream.schemas.trace import TraceBatch

__all__ = ["CHROME_PHASES", "rank_in_name", "TraceFile", "scan_trace", "check_inputs", "scan_files", "file_parts"]

_RANK_IN_NAME = re.compile(r"rank[_\-]?(\d+)", re.IGNORECASE)


#: The rank-metadata key that carries a file's time base (``baseTimeNanoseconds``, 0 when its times
#: are absolute): ``run_gpu_events`` (schemas/views.sql) reads it to put times on the file's grid.
TRACE_BASE_KEY = "trace_base_ns"


@dataclass
class TraceFile:
    """What the first pass learned about one file."""

    path: Path
    events: int = 0
    base_ns: int = 0
    rank: int | None = None
    world_size: int | None = None
    ranks_from_pid: bool = False
    #: The file did not say its rank and was taken as the caller's fallback rank.
    rank_assumed: bool = False
    steps: dict[int, Steps] = field(default_factory=dict)
    #: Integer pids seen: the ranks of a merged trace.
    pids: set[int] = field(default_factory=set)
    session_id: str = ""
    #: Events refused by ``trace_validation``, as ``input_rejects`` rows (the others are imported).
    rejects: list[dict] = field(default_factory=list)


def rank_in_name(path: Path) -> int | None:
    """The rank a file's name gives (``rank3``, ``rank_3``, ``rank-3``), if any."""
    match = _RANK_IN_NAME.search(path.name)
    return int(match.group(1)) if match else None


def _step_spans(events: list[dict]) -> list[tuple[Any, int, int, int]]:
    """(pid, start ns, end ns, step) of the ``ProfilerStep#N`` spans among ``events``."""
    spans = []
    for event in (e for e in events if "ProfilerStep#" in str(e.get("name"))):
        name = event.get("name")
        if type(name) is str and event["ph"] == "X" and (step := step_number(name)) is not None:
            start = int(event["ts"] * 1000)
            spans.append((event.get("pid", 0), start, start + int(event.get("dur", 0) * 1000), step))
    return spans


def scan_trace(path: Path, rank: int | None = None, batches: BatchFile | None = None,
               *, batch_events: int = 1000, fallback_rank: int | None = None) -> TraceFile:
    """First pass: check every event, find the rank, the base time and the step spans, and (with
    ``batches``) convert the events into batches of ``batch_events``. A file that does not say its
    rank is refused, or taken as ``fallback_rank`` when one is given."""
    check_input_file(path)
    info = TraceFile(path=path)
    spans: list[tuple[int, int, int, int]] = []
    pids: set = set()
    with open_trace(path) as raw:
        recorder = Recorder(raw)
        try:
            index = 0
            for chunk in event_chunks(path, recorder):
                events, refused = checked_chunk(chunk)
                info.rejects += [{"source": str(path), "item": index + at, "reason": f"event {index + at}: {problem}",
                                  "raw": item_as_json(chunk[at])} for at, problem in refused]
                index += len(chunk)
                info.events += len(events)
                try:
                    pids.update(e.get("pid") for e in events)
                except TypeError:
                    raise BadInput(f"{path}: an event's 'pid' is neither a number nor a name") from None
                spans += ((as_int(pid), start, end, step) for pid, start, end, step in _step_spans(events))
                if batches is not None:
                    for batch in trace_batches(event_columns(events), batch_events):
                        batches.append(batch)
        except RecursionError as exc:  # args nested too deep to encode, though ijson read them
            raise BadInput(f"{path}: {unreadable(path, exc)}") from None
        except (ijson.JSONError, ValueError, OSError, EOFError, zlib.error) as exc:
            reason = (str(exc).strip().splitlines() or [""])[0]
            raise BadInput(f"{path}: not readable as a Chrome trace: {type(exc).__name__}: {reason}"[:400]) from None
        digest = zlib.crc32(recorder.head + recorder.tail)
    if info.events == 0:
        raise BadInput(f"{path}: " + (f"{info.rejects[0]['reason']} (none of its {len(info.rejects)} events is valid)"
                                      if info.rejects else "contains no trace events"))
    info.pids = {p for p in pids if isinstance(p, int) and not isinstance(p, bool)}
    info.base_ns, distributed = read_metadata(recorder.head, recorder.tail)
    info.rank = rank
    if info.rank is None and distributed and isinstance(distributed.get("rank"), int):
        info.rank = distributed["rank"]
        info.world_size = distributed.get("world_size") if isinstance(distributed.get("world_size"), int) else None
    if info.rank is None:
        info.rank = rank_in_name(path)
    if info.rank is None and fallback_rank is not None and not _pids_are_ranks(pids):
        info.rank, info.rank_assumed = fallback_rank, True
    if info.rank is None:
        if not _pids_are_ranks(pids):
            raise BadInput(f"{path}: cannot tell the rank (no distributedInfo, no rank in the file name, "
                           "pids are not ranks); pass --rank")
        info.ranks_from_pid = True
    info.steps = steps_by_pid(spans)
    info.session_id = content_session_id(path.name, str(path.stat().st_size), str(digest))
    return info


def _pids_are_ranks(pids: set) -> bool:
    """Whether the pids could be ranks, as in a merged trace (small non-negative integers)."""
    return all(isinstance(p, int) and 0 <= p < 1 << 16 for p in pids if p is not None)


#: Composer's clock-sync metadata, already applied in a merged trace (see the module docstring).
_APPLIED_CLOCK_SYNC = frozenset({"clock_sync_timestamp_us", "clock_sync_error_bound"})


def file_parts(info: TraceFile, batches: BatchFile) -> Iterator[tuple[int, TraceBatch]]:
    """Second pass: the file's batches with absolute times and steps, as (rank, batch); a merged
    trace's events go to the rank of their pid, without its applied clock-sync metadata."""
    for batch in batches:
        batch = finish_batch(batch, info.base_ns, info.steps)
        if info.ranks_from_pid:
            pids, _ = batch.int_column("pid")
            codes, names = batch.string_column("name")
            applied = np.isin(codes, [i for i, name in enumerate(names) if name in _APPLIED_CLOCK_SYNC])
            for pid in np.unique(pids):
                yield int(pid), batch.select(np.flatnonzero((pids == pid) & ~applied))
        else:
            yield info.rank, batch


#: Below this much input, reading the files one after another beats starting reader processes.
PARALLEL_READ_BYTES = 16 << 20


def _scan_into(path: Path, rank: int | None, batch_events: int, batch_path: Path,
               fallback_rank: int | None = None) -> TraceFile:
    """A reader process's work: the first pass of one file, its batches into ``batch_path``."""
    with BatchFile(batch_path) as batches:
        return scan_trace(path, rank, batches, batch_events=batch_events, fallback_rank=fallback_rank)


def check_inputs(paths: list[Path], rank: int | None) -> None:
    """Refuse ``rank`` with several files and a path that is no input file, before reading any."""
    if rank is not None and len(paths) > 1:
        raise BadInput("--rank applies to one file; name the rank in each file name instead")
    for path in paths:
        check_input_file(path)


def scan_files(paths: list[Path], rank: int | None, batch_events: int, *, directory: Path,
               fallback_rank: int | None = None) -> list[TraceFile]:
    """The first pass of every file, one process per core when there is enough to read; the
    batches of ``paths[i]`` end up in ``directory / f"{i}"``. The first bad file (in the order
    given) raises its error; so do ``rank`` with several files and a path that is no input file,
    before anything is read."""
    check_inputs(paths, rank)
    batch_paths = [directory / str(i) for i in range(len(paths))]
    ranks, sizes, fallbacks = [rank] * len(paths), [batch_events] * len(paths), [fallback_rank] * len(paths)
    workers = min(len(paths), os.cpu_count() or 1)
    total = sum(path.stat().st_size for path in paths)
    # Forked readers start at once and need no importable main module (spawned ones re-run the
    # caller's script). A fork copies no thread, so a lock that another thread held would stay
    # held in the child: with other threads running, the files are read here, one by one.
    if workers < 2 or total < PARALLEL_READ_BYTES or threading.active_count() > 1:
        return list(map(_scan_into, paths, ranks, sizes, batch_paths, fallbacks))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        try:
            return list(pool.map(_scan_into, paths, ranks, sizes, batch_paths, fallbacks))
        except BrokenProcessPool:
            raise RankstreamError("a trace reader process died (out of memory?); "
                                  "import the files one at a time") from None
