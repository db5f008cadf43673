"""Reading a directory of dumps for the diagnosis: every file, in parallel, into columns.

Each worker process reads its share of the files with the FR reader (``producers.fr_reader``:
the plain-data unpickler or JSON) and turns each rank's entries into the diagnosis's columns
(``entries.from_dump_entries``), so only compact numpy arrays travel back. Stack frames are not
converted: only the culprits' are read, afterwards (``stack_at``). A set that mixes pickle and
JSON dumps, or dumps of different world sizes, is refused with one line naming the file.
"""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankstream.flows.diagnosis.entries import Entries, Vocabulary, concatenate, from_dump_entries, recoded
from rankstream.producers.fr_reader import groups_from_pg_config, list_fr_files, parse_dump
from rankstream.producers.importing import check_input_file, paused_gc
from rankstream.schemas.errors import BadInput

__all__ = ["LoadedDumps", "load_directory", "stack_at"]

#: Below this many files, starting worker processes costs more than it saves.
_PARALLEL_FROM = 16


@dataclass
class LoadedDumps:
    entries: Entries
    #: group name -> its ranks, as the dumps listed them.
    listed: dict[str, list[int]]
    #: rank -> its dump file.
    files: dict[int, Path]


@dataclass
class _One:
    rank: int
    path: str
    entries: Entries
    listed: dict[str, list[int]]
    json: bool
    world: int | None


def _read(job: tuple[int, str, frozenset | None]) -> _One | str:
    """In a worker: one dump, or a one-line error."""
    rank, path_text, pg_filters = job
    path = Path(path_text)
    try:
        check_input_file(path)
        raw = path.read_bytes()
        with paused_gc():
            dump = parse_dump(raw, str(path))
            groups = groups_from_pg_config(dump.get("pg_config"))
            listed = {g["pg_name"]: sorted(g["ranks"]) for g in groups if g["ranks"]}
            entries = dump["entries"]
            if pg_filters:
                entries = [e for e in entries if isinstance(e, dict) and _group_matches(e, pg_filters)]
            columns = from_dump_entries(entries, rank, listed, Vocabulary())
    except BadInput as exc:
        return str(exc)
    except ValueError as exc:
        return f"{path}: an entry does not follow the Flight Recorder dump layout: {exc}"
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror or exc}"
    defaults = [g for g in groups if g["pg_desc"] == "default_pg" and g["ranks"]]
    return _One(rank, path_text, columns, listed, raw.lstrip()[:1] in (b"{", b"["),
                len(defaults[0]["ranks"]) if defaults else None)


def _group_matches(entry: dict, filters: frozenset) -> bool:
    group = entry.get("process_group")
    return isinstance(group, (list, tuple)) and any(str(part) in filters for part in group[:2])


def load_directory(directory: Path, prefix: str = "rank", *, selected_ranks: set[int] | None = None,
                   pg_filters: set[str] | None = None) -> LoadedDumps:
    files = list_fr_files(directory, prefix, selected_ranks)
    jobs = [(rank, str(path), frozenset(pg_filters) if pg_filters else None) for rank, path in files]
    workers = min(os.cpu_count() or 1, 8)
    if len(jobs) >= _PARALLEL_FROM and workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(_read, jobs, chunksize=max(1, len(jobs) // (workers * 4)))
    else:
        results = list(map(_read, jobs))
    return _gathered(results)


def _gathered(results: list[Any]) -> LoadedDumps:
    errors = [r for r in results if isinstance(r, str)]
    if errors:
        raise BadInput(errors[0])
    first = results[0]
    vocabulary, parts, listed = Vocabulary(), [], {}
    for one in results:
        if one.json != first.json:
            raise BadInput(f"{one.path}: a {'JSON' if one.json else 'pickle'} dump among "
                           f"{'JSON' if first.json else 'pickle'} ones ({first.path}): one set, one format")
        if one.world is not None and first.world is not None and one.world != first.world:
            raise BadInput(f"{one.path}: its default group has {one.world} ranks, {first.path}'s has {first.world}: "
                           "dumps of different jobs")
        for name, ranks in one.listed.items():
            listed.setdefault(name, ranks)
        parts.append(recoded(one.entries, vocabulary))
    return LoadedDumps(concatenate(parts, vocabulary), listed, {one.rank: Path(one.path) for one in results})


def stack_at(path: Path, group: str | None, seq: int | None) -> list[dict]:
    """The Python stack torch recorded for the entry at ``seq`` of ``group`` in one dump (or the
    dump's newest entry of that group), innermost first; empty when it kept none."""
    try:
        entries = parse_dump(path.read_bytes(), str(path))["entries"]
    except (BadInput, OSError):
        return []
    chosen = None
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        names = entry.get("process_group") or ()
        if group is not None and (not names or str(names[0]) != group):
            continue
        if seq is None or entry.get("collective_seq_id") == seq or entry.get("p2p_seq_id") == seq:
            chosen = entry
    frames = chosen.get("frames") if chosen else None
    return [{"name": f.get("name"), "filename": f.get("filename"), "line": f.get("line")}
            for f in frames if isinstance(f, dict)][:20] if isinstance(frames, list) else []
