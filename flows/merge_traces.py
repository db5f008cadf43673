"""``rankstream merge FILE... -o OUT``: per-rank trace files to one Chrome trace, without a broker.

What Composer's trace merger does, as one command (like ``diagnose`` for Flight Recorder dumps):
the files' events become the rows ``rankstream import trace`` stores, in a scratch DuckDB database
instead of going through the bus; they are put on one clock (``flows.clocks``: Composer's clock-sync
metadata with its error bound, Kineto's base time, or ProfilerStep starts) and written as one
timeline (``flows.timeline``, pid = rank).

Plain JSON arrays (Composer's per-rank traces) are read by DuckDB itself, one file per core
(``producers.trace_sql_reader``); every other file, and any that reader declines, by the
importer's reader (``scan_files``). The scratch database lives in memory up to
``SCRATCH_MEMORY``, beyond which DuckDB spills to the scratch directory, which goes when the
command ends; a bad file stops it before anything is written.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import duckdb

from rankstream.consumers.projector import trace_table
from rankstream.consumers.store import insert_arrow
from rankstream.consumers.query import Database
from rankstream.flows.clocks import clock_offsets, align_clocks
from rankstream.flows.timeline import TimelineResult, write_timeline
from rankstream.producers.batch_file import BatchFile
from rankstream.schemas.errors import BadInput
from rankstream.producers.import_trace import TRACE_BASE_KEY, TraceFile, check_inputs, file_parts, scan_files
from rankstream.producers.trace_sql_reader import insert_array_trace
from rankstream.schemas.tables import ddl

__all__ = ["MergedTraces", "merge_trace_files", "scratch_run", "RUN_ID"]

#: The run the scratch database files the events under (it holds nothing else).
RUN_ID = "merged"
#: Batches per INSERT (a fixed number of events, whatever the files' size): larger inserts raised
#: the command's peak memory for almost no time saved (docs/benchmarks.md).
_BATCHES_PER_INSERT = 64
#: DuckDB's memory for the scratch database; past it, its blocks spill to the scratch directory.
SCRATCH_MEMORY = "256MB"


@dataclass
class MergedTraces:
    files: list[TraceFile]
    #: Every clock estimate per rank, the chosen one first (``flows.clocks.clock_offsets``).
    offsets: list[dict]
    timeline: TimelineResult


def merge_trace_files(paths: list[Path], output: Path, *, rank: int | None = None, steps: str | None = None,
                      window: str | None = None, max_events: int = 2_000_000, batch_events: int = 1000) -> MergedTraces:
    """Check every file, read them into a scratch database, align their clocks, write the timeline
    (``steps``/``window``/``max_events`` as for :func:`~rankstream.flows.timeline.write_timeline`)."""
    with scratch_run(paths, rank=rank, batch_events=batch_events) as (database, files):
        align_clocks(database, RUN_ID)
        return MergedTraces(files=files, offsets=clock_offsets(database, RUN_ID),
                            timeline=write_timeline(database, RUN_ID, output, steps=steps, window=window,
                                                    max_events=max_events))


@contextlib.contextmanager
def scratch_run(paths: list[Path], *, rank: int | None = None, batch_events: int = 1000,
                fallback_rank: int | None = None) -> Iterator[tuple[Database, list[TraceFile]]]:
    """The files' events as run ``RUN_ID`` of a scratch database that lives as long as the block
    (what ``merge`` and ``analyze trace`` work on, with no broker). Every file is checked first; a
    file that does not say its rank is refused, or taken as ``fallback_rank`` when one is given."""
    check_inputs(paths, rank)
    with tempfile.TemporaryDirectory(prefix="rankstream-scratch-") as scratch:
        connection = duckdb.connect(config={"memory_limit": SCRATCH_MEMORY, "temp_directory": scratch})
        try:
            connection.execute(ddl())
            files = _read_arrays(connection, paths, rank)
            rest = [path for path, info in zip(paths, files) if info is None]
            scanned = iter(scan_files(rest, rank, batch_events, directory=Path(scratch), fallback_rank=fallback_rank)
                           if rest else [])
            for index, info in enumerate(scanned):
                if info.rejects:  # no rejects table here: a file is used whole or not at all
                    raise BadInput(f"{info.path}: {info.rejects[0]['reason']} ({len(info.rejects)} bad event(s))")
                with BatchFile(Path(scratch) / str(index)) as batches:
                    _insert(connection, info, batches)
                files[files.index(None)] = info
            yield Database.over(connection, "the scratch database"), files
        finally:
            connection.close()


def _read_arrays(connection: duckdb.DuckDBPyConnection, paths: list[Path], rank: int | None) -> list[TraceFile | None]:
    """The files DuckDB's reader takes, read one per core (each on its own cursor); None for the rest."""
    with ThreadPoolExecutor(min(len(paths), os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda path: insert_array_trace(connection.cursor(), path, RUN_ID, rank=rank), paths))


def _insert(con: duckdb.DuckDBPyConnection, info: TraceFile, batches: BatchFile) -> None:
    """One file's events into ``trace_events``, with absolute times, steps and ranks."""
    ranks = set()
    parts = ((RUN_ID, rank, batch) for rank, batch in file_parts(info, batches))
    while chunk := list(itertools.islice(parts, _BATCHES_PER_INSERT)):  # a chunk at a time: bounded memory
        insert_arrow(con, "trace_events", trace_table(chunk))
        ranks |= {rank for _, rank, _ in chunk}
    for rank in sorted(ranks):  # what an import through the bus records about the file (producers.publish)
        con.execute("INSERT INTO rank_metadata (run_id, rank, session_id, sent_ns, metadata) "
                    "VALUES (?, ?, ?, 0, ?)",
                    [RUN_ID, rank, info.session_id, json.dumps({"imported_from": str(info.path),
                                                                TRACE_BASE_KEY: info.base_ns})])
