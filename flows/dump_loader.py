"""Fast loading of a Flight Recorder dump directory straight into DuckDB, for ``diagnose``.

The importer (``rankstream import fr``) publishes through the bus and is bound by per-entry
validation; a one-shot diagnosis of thousands of dumps cannot afford that. Here each file becomes
an Arrow table directly: unpickled (plain-data unpickler) or JSON-parsed, its entries turned into
columns in one pass per field, and its dicts dropped before the next file, so memory holds columns,
not millions of dicts. Files are read by worker processes when there are many. The resulting
``fr_entries`` rows are the same as those the materializer writes for imported dumps.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from rankstream.errors import BadInput
from rankstream.producers.import_fr import list_fr_files, parse_dump_bytes
from rankstream.producers.importing import check_input_file
from rankstream.consumers.projector import FR_FRAMES_TYPE, FR_SIZES_TYPE
from rankstream.schemas.fr_dump import DUMP_FIELDS, groups_from_pg_config
from rankstream.schemas.safe_pickle import UnsafePickle

__all__ = ["iter_dump_tables", "load_dump_directory", "FR_SCHEMA"]

FR_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("rank", pa.int32()), ("snapshot_ns", pa.int64()), ("record_id", pa.int64()),
    ("pg_id", pa.int64()), ("pg_name", pa.string()), ("pg_desc", pa.string()), ("thread_name", pa.string()),
    ("thread_id", pa.string()), ("collective_seq_id", pa.int64()), ("p2p_seq_id", pa.int64()), ("op_id", pa.int64()),
    ("profiling_name", pa.string()), ("time_created_ns", pa.int64()), ("time_discovered_started_ns", pa.int64()),
    ("time_discovered_completed_ns", pa.int64()), ("input_sizes", FR_SIZES_TYPE), ("input_dtypes", pa.list_(pa.string())),
    ("output_sizes", FR_SIZES_TYPE), ("output_dtypes", pa.list_(pa.string())), ("state", pa.string()),
    ("retired", pa.bool_()), ("timeout_ms", pa.int64()), ("is_p2p", pa.bool_()), ("frames", FR_FRAMES_TYPE),
])
#: Fields copied as torch wrote them; the others are converted below (or are the row's identity).
_PLAIN = tuple(name for name in DUMP_FIELDS if name not in (
    "record_id", "thread_id", "time_discovered_started_ns", "time_discovered_completed_ns", "frames"))
#: Below this many files, worker processes cost more than they save.
_PARALLEL_FROM = 32


#: What the collective analysis reads; the other FR columns are left NULL when loading for it.
_ANALYSIS_FIELDS = ("collective_seq_id", "p2p_seq_id", "profiling_name", "time_created_ns", "input_sizes",
                    "input_dtypes", "output_sizes", "state", "is_p2p")


def _table(entries: list, rank: int, run_id: str, with_frames: bool, complete: bool = True) -> pa.Table:
    n = len(entries)
    columns: dict[str, Any] = {"run_id": pa.array([run_id] * n, pa.string()), "rank": pa.array([rank] * n, pa.int32()),
                               "snapshot_ns": pa.array([0] * n, pa.int64()),
                               "record_id": [e["record_id"] for e in entries]}
    groups = [e.get("process_group") or (None, None) for e in entries]
    columns["pg_name"] = [None if g[0] is None else str(g[0]) for g in groups]
    columns["pg_desc"] = [None if len(g) < 2 or g[1] is None else str(g[1]) for g in groups]
    for name in _PLAIN if complete else _ANALYSIS_FIELDS:
        columns[name] = [e.get(name) for e in entries]
    if complete:
        columns["thread_id"] = [None if t is None else str(t) for t in (e.get("thread_id") for e in entries)]
        for name in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            columns[name] = [e.get(name) or None for e in entries]  # JSON dumps write 0 for unknown
    if with_frames:
        columns["frames"] = [e.get("frames") for e in entries]
    for field in FR_SCHEMA:
        if field.name not in columns:
            columns[field.name] = pa.nulls(n, field.type)
    return pa.table(columns, schema=FR_SCHEMA)


def _load_one(job: tuple[int, str, str, bool, bool]) -> tuple[str, Any]:
    """Runs in a worker: one file to ("ok", (IPC bytes, groups)) or ("error", one-line message).

    The cyclic garbage collector is paused meanwhile: a dump unpickles into tens of thousands of
    small objects that hold no cycles, and collecting as they appear costs a third of the time."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _load_file(job)
    finally:
        if gc_was_enabled:
            gc.enable()


def _load_file(job: tuple[int, str, str, bool, bool]) -> tuple[str, Any]:
    rank, path_text, run_id, with_frames, complete = job
    path = Path(path_text)
    try:
        check_input_file(path)
        dump = parse_dump_bytes(path.read_bytes())
        if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list):
            raise BadInput(f"{path}: not a Flight Recorder dump (expected a map with a list 'entries')")
        entries = dump.get("entries", [])
        try:
            table = _table(entries, rank, run_id, with_frames, complete)
        except (KeyError, TypeError, AttributeError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise BadInput(f"{path}: an entry does not follow the FR dump layout ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:200]})") from None
        if table.num_rows and pc.any(pc.is_null(table["profiling_name"])).as_py():
            raise BadInput(f"{path}: an entry has no profiling_name")
        prefixes = {n.split(":", 1)[0] for n in pc.unique(table["profiling_name"]).to_pylist() if ":" in n}
        backend = prefixes.pop() if len(prefixes) == 1 else None
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return "ok", (sink.getvalue().to_pybytes(), groups_from_pg_config(dump.get("pg_config"), backend))
    except BadInput as exc:
        return "error", str(exc)
    except (UnsafePickle, ValueError) as exc:
        return "error", f"{path}: {exc}"
    except OSError as exc:
        return "error", f"{path}: cannot read: {exc.strerror or exc}"


def iter_dump_tables(directory: Path, prefix: str, run_id: str, *, selected_ranks: set[int] | None = None,
                     with_frames: bool = False, complete: bool = False) -> Iterator[tuple[int, pa.Table, list[dict]]]:
    """``(rank, fr_entries rows, process groups)`` per dump, in rank-file order, as workers finish
    them, so a caller can store each one and drop it. ``complete=False`` fills only the columns the
    analysis reads. Raises BadInput naming the first bad file."""
    files = list_fr_files(directory, prefix, selected_ranks)
    jobs = [(rank, str(path), run_id, with_frames, complete) for rank, path in files]
    if len(jobs) >= _PARALLEL_FROM and (os.cpu_count() or 1) > 1:
        with multiprocessing.get_context("fork").Pool(min(os.cpu_count() or 2, 4)) as pool:
            yield from _decoded(files, pool.imap(_load_one, jobs, chunksize=max(1, len(jobs) // 64)))
    else:
        yield from _decoded(files, (_load_one(job) for job in jobs))


def _decoded(files, results) -> Iterator[tuple[int, pa.Table, list[dict]]]:
    for (rank, _), (status, value) in zip(files, results):
        if status == "error":
            raise BadInput(value)
        ipc, groups = value
        yield rank, pa.ipc.open_stream(pa.py_buffer(ipc)).read_all(), [{"rank": rank, **g} for g in groups]


def load_dump_directory(directory: Path, prefix: str, run_id: str, *, selected_ranks: set[int] | None = None,
                        with_frames: bool = False, complete: bool = False) -> tuple[pa.Table, list[dict], list[int]]:
    """All dumps as one ``fr_entries`` Arrow table, the process groups and the ranks read."""
    tables, groups, ranks = [], [], []
    for rank, table, rank_groups in iter_dump_tables(directory, prefix, run_id, selected_ranks=selected_ranks,
                                                     with_frames=with_frames, complete=complete):
        tables.append(table)
        groups += rank_groups
        ranks.append(rank)
    return pa.concat_tables(tables), groups, ranks
