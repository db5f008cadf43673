"""``rankstream merge FILE... -o OUT``: per-rank trace files to one Chrome trace, without a broker.

What Composer's trace merger does, as one command (like ``diagnose`` for Flight Recorder dumps):
the files are read by the importer's first pass (so the rows are those ``rankstream import trace``
stores), written straight into a scratch DuckDB file instead of going through the bus, put on one
clock (``flows.merge``: Composer's clock-sync metadata with its error bound, Kineto's base time, or
ProfilerStep starts) and written as one timeline (``flows.timeline``, pid = rank). The scratch
directory goes when the command ends; a bad file stops it before anything is written.
"""

from __future__ import annotations

import itertools
import tempfile
from dataclasses import dataclass
from pathlib import Path

import duckdb

from rankstream.consumers.projector import trace_table
from rankstream.consumers.store import insert_arrow
from rankstream.flows.merge import clock_offsets, merge_run
from rankstream.flows.timeline import TimelineResult, write_timeline
from rankstream.producers.batch_file import BatchFile
from rankstream.producers.import_trace import TraceFile, file_parts, scan_files
from rankstream.schemas.tables import ddl

__all__ = ["MergedTraces", "merge_trace_files", "RUN_ID"]

#: The run the scratch database files the events under (it holds nothing else).
RUN_ID = "merged"
#: Batches per INSERT: about 64k events, whatever the files' size. With 256 (256k events) the
#: command's peak RSS was 426-443 MB on 2 x 72 MB files; with 64, 345-353 MB, for about 0.3 s more
#: (9.06 against 8.5-9.0 s). Capping DuckDB's memory as well saved 10 MB more and cost 0.7-2 s.
_BATCHES_PER_INSERT = 64


@dataclass
class MergedTraces:
    files: list[TraceFile]
    #: Every clock estimate per rank, the chosen one first (``flows.merge.clock_offsets``).
    offsets: list[dict]
    timeline: TimelineResult


def merge_trace_files(paths: list[Path], output: Path, *, rank: int | None = None, steps: str | None = None,
                      window: str | None = None, max_events: int = 2_000_000, batch_events: int = 1000) -> MergedTraces:
    """Merge ``paths`` into ``output`` (``.json`` or ``.json.gz``; ``steps``, ``window`` and
    ``max_events`` as for :func:`~rankstream.flows.timeline.write_timeline`)."""
    with tempfile.TemporaryDirectory(prefix="rankstream-merge-") as scratch:
        db_path = Path(scratch) / "merge.duckdb"
        files = scan_files(paths, rank, batch_events, Path(scratch))
        con = duckdb.connect(str(db_path))
        try:
            con.execute(ddl())
            for index, info in enumerate(files):
                with BatchFile(Path(scratch) / str(index)) as batches:
                    _insert(con, info, batches)
        finally:
            con.close()
        merge_run(db_path, RUN_ID)
        return MergedTraces(files=files, offsets=clock_offsets(db_path, RUN_ID),
                            timeline=write_timeline(db_path, RUN_ID, output, steps=steps, window=window,
                                                    max_events=max_events))


def _insert(con: duckdb.DuckDBPyConnection, info: TraceFile, batches: BatchFile) -> None:
    """One file's events into ``trace_events``, with absolute times, steps and ranks."""
    parts = ((RUN_ID, rank, batch) for rank, batch in file_parts(info, batches))
    while chunk := list(itertools.islice(parts, _BATCHES_PER_INSERT)):  # a chunk at a time: bounded memory
        insert_arrow(con, "trace_events", trace_table(chunk))
