"""Fast loading of a Flight Recorder dump directory for ``diagnose``: dumps to Parquet files.

The importer (``rankstream import fr``) publishes through the bus and is bound by per-entry
validation; a one-shot diagnosis of thousands of dumps cannot afford that. Here worker processes
turn each file into an Arrow table directly (unpickled with the plain-data unpickler or
JSON-parsed, the entry dicts converted by Arrow, then dropped) and write a chunk of dumps per
Parquet file, which DuckDB reads in place: the rows never pass through the caller's process. The
``fr_entries`` rows are the same as those the materializer writes for imported dumps.
"""

from __future__ import annotations

import copy
import hashlib
import json
import multiprocessing
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rankstream.schemas.errors import BadInput
from rankstream.producers.fr_reader import backend_of, entry_from_dump, groups_from_pg_config, list_fr_files, parse_dump
from rankstream.producers.importing import check_input_file, paused_gc
from rankstream.schemas.fields import PayloadError
from rankstream.schemas.tables import FR_ENTRIES

__all__ = ["LoadedDumps", "write_dump_parquet", "load_dump_directory", "FR_SCHEMA"]

FR_SCHEMA = FR_ENTRIES.arrow_schema()
#: Below this many files, worker processes cost more than they save.
_PARALLEL_FROM = 32


#: What the collective analysis reads; the other FR columns are left NULL when loading for it.
_ANALYSIS_FIELDS = ("collective_seq_id", "p2p_seq_id", "profiling_name", "time_created_ns", "input_sizes",
                    "input_dtypes", "output_sizes", "state", "is_p2p")


#: The analysis columns as Arrow converts them straight from the entry dicts (in C++, which is
#: about twice as fast as gathering each column in Python); ``process_group`` is split afterwards.
_ANALYSIS_STRUCT = pa.struct([("record_id", pa.int64()), ("process_group", pa.list_(pa.string()))] + [
    (name, FR_SCHEMA.field(name).type) for name in _ANALYSIS_FIELDS])


def _analysis_table(entries: list, rank: int, run_id: str) -> pa.Table:
    """The columns the analysis reads, converted by Arrow; other columns NULL. Raises ArrowInvalid
    or ArrowTypeError where a dump strays from torch's types (then ``_table`` converts leniently)."""
    n = len(entries)
    fields = pa.array(entries, type=_ANALYSIS_STRUCT).flatten()
    by_name = dict(zip(_ANALYSIS_STRUCT.names, fields))
    group = by_name.pop("process_group")
    columns = {**_key_columns(n, rank, run_id), **by_name,
               "pg_name": pc.list_element(group, 0) if n else pa.array([], pa.string()),
               "pg_desc": pc.if_else(pc.greater(pc.list_value_length(group), 1),
                                     pc.list_element(group, 1), None) if n else pa.array([], pa.string())}
    return _fr_table(columns, n)


def _key_columns(n: int, rank: int, run_id: str) -> dict[str, pa.Array]:
    """The columns every row of one dump shares (a dump is a snapshot with no time of its own)."""
    return {"run_id": pa.array([run_id] * n, pa.string()), "rank": pa.array([rank] * n, pa.int32()),
            "snapshot_ns": pa.array([0] * n, pa.int64())}


def _fr_table(columns: dict[str, Any], n: int) -> pa.Table:
    """``fr_entries`` rows from the columns given; the others NULL."""
    return pa.table([columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in FR_SCHEMA],
                    schema=FR_SCHEMA)


def _table(entries: list, rank: int, run_id: str, with_frames: bool, complete: bool = True) -> pa.Table:
    if not complete and not with_frames:
        try:
            return _analysis_table(entries, rank, run_id)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, IndexError):
            pass  # not torch's exact types: translated entry by entry below, as the bus import does
    rows = [entry_from_dump(entry) for entry in entries]
    n = len(rows)
    names = [c.name for c in FR_ENTRIES.wire_columns() if with_frames or c.name != "frames"] if complete else \
        ["record_id", "pg_name", "pg_desc", *_ANALYSIS_FIELDS] + (["frames"] if with_frames else [])
    columns = {**_key_columns(n, rank, run_id),
               **{name: pa.array([row[name] for row in rows], FR_SCHEMA.field(name).type) for name in names}}
    return _fr_table(columns, n)


#: The last ``pg_config`` this process read, its backend, and what it gave: ``(config, backend, key, groups)``.
_last_groups: tuple = (None, None, b"", [])


def _process_groups(pg_config: Any, backend: str | None) -> tuple[bytes, list[dict]]:
    """``(key, groups)`` of one dump. Every rank's dump usually repeats the same ``pg_config`` (all
    groups, thousands of rank lists at scale): comparing it with the previous dump's is a fraction
    of reading it again, and the key (a digest of the groups) lets the parent keep one copy."""
    global _last_groups
    config, last_backend, key, groups = _last_groups
    if pg_config != config or backend != last_backend:
        groups = groups_from_pg_config(pg_config, backend)
        key = hashlib.blake2b(json.dumps(groups).encode(), digest_size=16).digest()
        _last_groups = (copy.deepcopy(pg_config), backend, key, groups)
    return key, groups


@dataclass
class LoadedDumps:
    """What ``write_dump_parquet`` wrote: Parquet files of ``fr_entries`` rows, the process groups
    (each distinct configuration once, as the first rank that reported it) and the ranks read."""
    parquet_files: list[Path]
    groups: list[dict]
    ranks: list[int]
    #: Whether a dump holds a record id twice, and whether any coalesced collectives (the matching
    #: skips the work each would need when it knows there are none).
    repeated_records: bool = False
    coalesced: bool = False


def write_dump_parquet(directory: Path, prefix: str, run_id: str, out_dir: Path, *,
                       selected_ranks: set[int] | None = None, with_frames: bool = False,
                       complete: bool = False) -> LoadedDumps:
    """Read every dump of ``directory`` into Parquet files in ``out_dir``, a chunk of dumps per file.

    Worker processes read and write; the caller's process only gathers the process groups, so on a
    small machine it does not compete with them, and the rows never pass through it (DuckDB reads
    the files). ``complete=False`` fills only the columns the analysis reads. Raises BadInput naming
    the first bad file, in rank-file order."""
    files = list_fr_files(directory, prefix, selected_ranks)
    workers = min(os.cpu_count() or 1, 4)
    per_chunk = max(1, min(64, len(files) // (workers * 8)))
    jobs = [(str(out_dir / f"entries-{i:05d}.parquet"), [(rank, str(path)) for rank, path in files[at:at + per_chunk]],
             run_id, with_frames, complete) for i, at in enumerate(range(0, len(files), per_chunk))]
    if len(files) >= _PARALLEL_FROM and workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            return _gathered(pool.imap(_load_chunk, jobs))
    return _gathered(map(_load_chunk, jobs))


def _gathered(results) -> LoadedDumps:
    loaded, seen_groups = LoadedDumps([], [], []), set()
    for status, value in results:
        if status == "error":
            raise BadInput(value)
        parquet_file, dumps, layout = value
        if parquet_file is not None:
            loaded.parquet_files.append(Path(parquet_file))
        loaded.repeated_records |= layout["repeated_records"]
        loaded.coalesced |= layout["coalesced"]
        for rank, key, groups in dumps:
            loaded.ranks.append(rank)
            if key not in seen_groups:
                seen_groups.add(key)
                loaded.groups += [{"rank": rank, **g} for g in groups]
    return loaded


def _load_chunk(job: tuple[str, list[tuple[int, str]], str, bool, bool]) -> tuple[str, Any]:
    """Runs in a worker: some dumps to one Parquet file, giving ``("ok", (file or None, [(rank,
    groups key, groups)], layout flags))``, or ``("error", one-line message)`` at the first bad dump.

    The cyclic garbage collector is paused meanwhile (``paused_gc``)."""
    out_path, dumps, run_id, with_frames, complete = job
    with paused_gc():
        tables, read, keys = [], [], set()
        for rank, path_text in dumps:
            status, value = _load_file(Path(path_text), rank, run_id, with_frames, complete)
            if status == "error":
                return status, value
            table, key, groups = value
            tables.append(table)
            read.append((rank, key, [] if key in keys else groups))  # each key's groups once
            keys.add(key)
        layout = {
            "repeated_records": any(pc.count_distinct(t["record_id"]).as_py() < t.num_rows for t in tables),
            "coalesced": any(pc.any(pc.match_substring(t["profiling_name"], "coalesced")).as_py() for t in tables),
        }
        rows = pa.concat_tables(tables)
        if not rows.num_rows:
            return "ok", (None, read, layout)
        pq.write_table(rows, out_path, compression="none")
        return "ok", (out_path, read, layout)


def _load_file(path: Path, rank: int, run_id: str, with_frames: bool, complete: bool) -> tuple[str, Any]:
    try:
        check_input_file(path)
        dump = parse_dump(path.read_bytes(), str(path))
        try:
            table = _table(dump["entries"], rank, run_id, with_frames, complete)
        except (PayloadError, KeyError, TypeError, AttributeError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise BadInput(f"{path}: an entry does not follow the FR dump layout ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:200]})") from None
        if table.num_rows and pc.any(pc.is_null(table["profiling_name"])).as_py():
            raise BadInput(f"{path}: an entry has no profiling_name")
        backend = backend_of(pc.unique(table["profiling_name"]).to_pylist())
        return "ok", (table, *_process_groups(dump.get("pg_config"), backend))
    except BadInput as exc:
        return "error", str(exc)
    except OSError as exc:
        return "error", f"{path}: cannot read: {exc.strerror or exc}"


def load_dump_directory(directory: Path, prefix: str, run_id: str, *, selected_ranks: set[int] | None = None,
                        with_frames: bool = False, complete: bool = False) -> tuple[pa.Table, list[dict], list[int]]:
    """All dumps as one ``fr_entries`` Arrow table, the process groups and the ranks read."""
    with tempfile.TemporaryDirectory(prefix="rankstream-dumps-") as scratch:
        loaded = write_dump_parquet(directory, prefix, run_id, Path(scratch), selected_ranks=selected_ranks,
                                    with_frames=with_frames, complete=complete)
        tables = [pq.read_table(path, schema=FR_SCHEMA) for path in loaded.parquet_files]
    return (pa.concat_tables(tables) if tables else FR_SCHEMA.empty_table()), loaded.groups, loaded.ranks
