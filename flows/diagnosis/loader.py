"""Reading a directory of dumps for the diagnosis: every file, in parallel, into columns.

Each worker process reads its share of the files with the FR reader (``producers.fr_reader``:
the plain-data unpickler or JSON) and turns the entries into the diagnosis's columns, several
dumps at a time (``columnar.from_entry_tables``; ``entries.from_dump_entries`` for a dump Arrow
refuses), so only compact numpy arrays travel back. Stack frames are not
converted: only the culprits' are read, afterwards (``stack_at``). A set that mixes pickle and
JSON dumps, or dumps of different world sizes, is refused with one line naming the file.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from rankstream.flows.diagnosis.columnar import entry_table, from_entry_tables
from rankstream.flows.diagnosis.entries import Entries, Vocabulary, concatenate, from_dump_entries, recoded
from rankstream.flows.diagnosis.published_stacks import (BlockedCall, OutsideCommunication, innermost_call,
                                                         place_outside)
from rankstream.producers.fr_reader import groups_from_pg_config, list_fr_files, parse_dump
from rankstream.producers.importing import check_input_file, paused_gc
from rankstream.schemas.errors import BadInput
from rankstream.schemas.stack_frames import WRAPPER_FUNCTION

__all__ = ["LoadedDumps", "load_directory", "stack_at", "inside_for", "stack_file_places", "fatal_reports"]

#: Below this many files, starting worker processes costs more than it saves.
_PARALLEL_FROM = 16
#: Dumps converted to columns in one go (about 2000 entries each: a few tens of MB of Arrow arrays).
_BATCH_DUMPS = 32


@dataclass
class LoadedDumps:
    entries: Entries
    #: group name -> its ranks, as the dumps listed them.
    listed: dict[str, list[int]]
    #: rank -> its dump file.
    files: dict[int, Path]


@dataclass
class _Chunk:
    """What a worker read: its dumps' entries as one table, per dump (rank, path, JSON or not, size
    of its default group), and the groups they listed."""

    entries: Entries
    dumps: list[tuple[int, str, bool, int | None]]
    listed: dict[str, list[int]]


def _read_chunk(job: tuple[list[tuple[int, str]], frozenset | None]) -> _Chunk | str:
    """In a worker: some dumps, or a one-line error naming the first bad one."""
    files, pg_filters = job
    pa.set_cpu_count(1)  # the workers are the parallelism: Arrow's own threads would only compete
    vocabulary, parts, dumps, listed = Vocabulary(), [], [], {}
    previous_config, previous_groups = object(), []
    batch = _Batch(vocabulary, parts)
    for rank, path_text in files:
        path = Path(path_text)
        try:
            check_input_file(path)
            raw = path.read_bytes()
            with paused_gc():
                dump = parse_dump(raw, str(path))
                config = dump.get("pg_config")
                if config != previous_config:  # every dump of a job usually lists the same groups
                    previous_config, previous_groups = config, groups_from_pg_config(config)
                mine = {g["pg_name"]: sorted(g["ranks"]) for g in previous_groups if g["ranks"]}
                entries = dump["entries"]
                if pg_filters:
                    entries = [e for e in entries if isinstance(e, dict) and _group_matches(e, pg_filters)]
                try:
                    batch.add(entry_table(entries), rank, mine)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, IndexError, OverflowError):  # not torch's exact types
                    batch.flush()
                    parts.append(from_dump_entries(entries, rank, mine, vocabulary=vocabulary))
                del dump, entries
        except BadInput as exc:
            return str(exc)
        except ValueError as exc:
            return f"{path}: an entry does not follow the Flight Recorder dump layout: {exc}"
        except OSError as exc:
            return f"{path}: cannot read: {exc.strerror or exc}"
        for name, ranks in mine.items():
            listed.setdefault(name, ranks)
        defaults = [g for g in previous_groups if g["pg_desc"] == "default_pg" and g["ranks"]]
        dumps.append((rank, path_text, raw.lstrip()[:1] in (b"{", b"["),
                      len(defaults[0]["ranks"]) if defaults else None))
    batch.flush()
    return _Chunk(concatenate(parts, vocabulary), dumps, listed)


class _Batch:
    """Dumps converted to columns together (``from_entry_tables``) while they list the same groups,
    up to ``_BATCH_DUMPS`` at a time so that a worker's Arrow tables stay small."""

    def __init__(self, vocabulary: Vocabulary, parts: list[Entries]) -> None:
        self.vocabulary, self.parts = vocabulary, parts
        self.tables: list[pa.StructArray] = []
        self.ranks: list[int] = []
        self.members: dict[str, list[int]] | None = None

    def add(self, table: pa.StructArray, rank: int, members: dict[str, list[int]]) -> None:
        if self.tables and (members != self.members or len(self.tables) >= _BATCH_DUMPS):
            self.flush()
        self.tables.append(table)
        self.ranks.append(rank)
        self.members = members

    def flush(self) -> None:
        if self.tables:
            self.parts.append(from_entry_tables(self.tables, self.ranks, self.members or {},
                                                vocabulary=self.vocabulary))
        self.tables, self.ranks = [], []


def _group_matches(entry: dict, filters: frozenset) -> bool:
    group = entry.get("process_group")
    return isinstance(group, (list, tuple)) and any(str(part) in filters for part in group[:2])


def load_directory(directory: Path, prefix: str = "rank", *, selected_ranks: set[int] | None = None,
                   pg_filters: set[str] | None = None) -> LoadedDumps:
    files = [(rank, str(path)) for rank, path in list_fr_files(directory, prefix, selected_ranks)]
    filters = frozenset(pg_filters) if pg_filters else None
    workers = min(os.cpu_count() or 1, 8)
    if len(files) < _PARALLEL_FROM or workers < 2:
        return _gathered([_read_chunk((files, filters))])
    size = max(1, -(-len(files) // (workers * 4)))  # a few chunks per worker, for balance
    jobs = [(files[at:at + size], filters) for at in range(0, len(files), size)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return _gathered(pool.imap(_read_chunk, jobs))


def _gathered(results) -> LoadedDumps:
    vocabulary, parts, listed, dumps = Vocabulary(), [], {}, []
    for chunk in results:
        if isinstance(chunk, str):
            raise BadInput(chunk)
        for name, ranks in chunk.listed.items():
            listed.setdefault(name, ranks)
        dumps += chunk.dumps
        parts.append(recoded(chunk.entries, vocabulary))
    first = dumps[0]
    for rank, path, json_dump, world in dumps:
        if json_dump != first[2]:
            raise BadInput(f"{path}: a {'JSON' if json_dump else 'pickle'} dump among "
                           f"{'JSON' if first[2] else 'pickle'} ones ({first[1]}): one set, one format")
        if world is not None and first[3] is not None and world != first[3]:
            raise BadInput(f"{path}: its default group has {world} ranks, {first[1]}'s has {first[3]}: "
                           "dumps of different jobs")
    return LoadedDumps(concatenate(parts, vocabulary), listed, {rank: Path(path) for rank, path, _, _ in dumps})


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


def inside_for(path: Path, group: str, seq: int) -> int | None:
    """Nanoseconds from the rank's creation of collective ``seq`` of ``group`` to the dump, when
    it was inside that call then; None when the dump does not show it. torch stamps a call it
    finds started only when it dumps (``time_discovered_started_ns``), so that stamp is the dump's
    moment when it is the dump's newest time: minutes after a timeout, milliseconds in a dump taken
    while the job ran."""
    try:
        entries = parse_dump(path.read_bytes(), str(path))["entries"]
    except (BadInput, OSError):
        return None
    newest, found = 0, None
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        times = [entry.get(key) for key in ("time_created_ns", "time_discovered_started_ns",
                                             "time_discovered_completed_ns")]
        newest = max([newest] + [t for t in times if isinstance(t, int)])
        names = entry.get("process_group") or ()
        if names and str(names[0]) == group and entry.get("collective_seq_id") == seq and not entry.get("is_p2p"):
            found = entry
    if found is None or found.get("state") != "started":
        return None
    created, stamped = found.get("time_created_ns"), found.get("time_discovered_started_ns")
    if not (isinstance(created, int) and isinstance(stamped, int)) or stamped < newest or stamped < created:
        return None
    return stamped - created


#: ``  File "train.py", line 41 in load_batch``: a frame of a ``faulthandler`` stack.
_FRAME = re.compile(r'^\s*File "(?P<filename>[^"]*)", line (?P<line>\d+) in (?P<name>.*)$')


def stack_file_places(directory: Path) -> dict[int, BlockedCall | OutsideCommunication]:
    """rank -> where its main thread was when it dumped, from the ``stacks_rank<N>.txt`` files
    ``rankstream run --on-hang dump`` writes beside the dumps (``faulthandler``'s text, written at
    the same moment): what the live stacks tell the stored diagnosis, for the dumps alone."""
    places = {}
    for path in directory.glob("stacks_rank*.txt"):
        rank = path.stem.removeprefix("stacks_rank")
        main = _recorded_frames(path.with_suffix(".json"))  # with the peers its call names
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        place = _place(main or _main_stack(text))
        if rank.isdigit() and place is not None:
            places[int(rank)] = place
    return places


def fatal_reports(directory: Path) -> dict[int, str]:
    """rank -> what its ``fatal_rank<N>.txt`` says (``faulthandler``'s report, written when a
    rank died in native code): "fatal error: Segmentation fault in script.py:14 in main". Ranks
    whose file is empty (they did not die so) are left out."""
    reports = {}
    for path in directory.glob("fatal_rank*.txt"):
        rank = path.stem.removeprefix("fatal_rank")
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        error = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                      if line.startswith("Fatal Python error:")), None)
        if not rank.isdigit() or error is None:
            continue
        # the thread that crashed, or, when a thread of native code did (gloo's abort), the main one
        current = _thread_stacks(text[text.find("Current thread"):]) if "Current thread" in text else []
        place = _place(current[0] if current else _main_stack(text))
        reports[int(rank)] = f"fatal error: {error}" + (f" in {place}" if place else "")
    return reports


def _main_stack(text: str) -> list[dict]:
    """The frames of the thread that runs the script in a ``faulthandler`` text (empty if none)."""
    return next((frames for frames in _thread_stacks(text) if any(f["name"] == "<module>" for f in frames)), [])


def _place(frames: list[dict]) -> BlockedCall | OutsideCommunication | None:
    """Where a stack is: in a ``torch.distributed`` call, or in the job's own code."""
    return (innermost_call(frames) or place_outside(frames)) if frames else None


def _recorded_frames(path: Path) -> list[dict] | None:
    """The main thread's frames as the rank recorded them beside its ``faulthandler`` text
    (``schemas.stack_frames``); None when there is no such file or it is not a list of frames."""
    try:
        frames = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return frames if isinstance(frames, list) and all(isinstance(f, dict) for f in frames) else None


def _thread_stacks(text: str) -> list[list[dict]]:
    """Each thread's frames in a ``faulthandler`` dump, innermost first (as it lists them)."""
    stacks, current = [], None
    for line in text.splitlines():
        if "(most recent call first)" in line:
            current = []
            stacks.append(current)
        elif current is not None and (frame := _FRAME.match(line)) and frame["name"] != WRAPPER_FUNCTION:
            current.append({"filename": frame["filename"], "line": int(frame["line"]), "name": frame["name"]})
    return stacks
