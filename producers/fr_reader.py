"""The Flight Recorder reader: torch's dump files and bytes in rankstream's fields.

The one place FR dumps are read, by ``rankstream import fr`` (through the bus), by ``rankstream
diagnose`` (``flows.diagnosis.loader``) and by the live tap (``producers.flight_recorder``), so live,
imported and diagnosed entries are the same rows. It reads what real dumps are (torch 2.x, NCCL
and gloo, pickle and JSON):

* pickles are read with the plain-data unpickler (``schemas.safe_pickle``): a pickle that names
  any class or function is refused, nothing runs;
* ``process_group`` is a ``(name, desc)`` tuple (pickle) or a list (JSON);
* JSON dumps write 0 for an unknown "discovered" time where pickle writes None: both become NULL;
* ``thread_id`` may be an int or a string;
* ``pg_config`` maps a group name to ``{"name", "desc", "ranks"}`` where ``ranks`` is a JSON text
  (``"[0, 1]"``) or a list; gloo dumps often carry one bogus ``""`` group with ``"[]"``;
* ``pg_status`` maps a group to its last enqueued/started/completed collective, as strings.

Directories are named the way PyTorch's ``fr_trace`` names them: every file whose name starts
with ``prefix`` is one rank's dump and the rest of its name is the rank (``rank_0``, ``rank_1``...).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from rankstream.producers.importing import check_input_file, content_session_id
from rankstream.schemas.errors import BadInput
from rankstream.schemas.fields import PayloadError
from rankstream.schemas.safe_pickle import UnsafePickle, safe_loads
from rankstream.schemas.tables import FR_ENTRIES

__all__ = ["FrDump", "DUMP_FIELDS", "parse_dump", "read_fr_dump", "read_fr_directory", "list_fr_files",
           "entry_from_dump", "groups_from_pg_config", "status_from_pg_status", "backend_of"]

#: Entry fields copied as torch names them (the others, pg_name and pg_desc, come from process_group).
DUMP_FIELDS = tuple(c.name for c in FR_ENTRIES.wire_columns() if c.name not in ("pg_name", "pg_desc"))
_TIMES = ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns")


@dataclass(frozen=True)
class FrDump:
    """One rank's dump, read and checked: its entries in rankstream's fields, its process groups,
    the groups' progress, the backend its entries name, and a session id derived from its bytes."""

    path: Path
    rank: int
    entries: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    status: dict[str, dict[str, int]]
    backend: str | None
    session_id: str


def parse_dump(raw: bytes, source: str, *, entries: bool = True) -> dict[str, Any]:
    """A dump's bytes (pickle or JSON) as a map; raises BadInput naming ``source`` and the problem.
    ``entries=False`` accepts the progress-only dumps the live tap asks for."""
    try:
        if raw.lstrip()[:1] in (b"{", b"["):
            try:
                dump = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                raise BadInput(f"{source}: not valid JSON: {str(exc)[:200]}") from None
        else:
            dump = safe_loads(raw)
    except UnsafePickle as exc:
        raise BadInput(f"{source}: {exc}") from None
    if not isinstance(dump, dict) or (entries and not isinstance(dump.get("entries"), list)):
        raise BadInput(f"{source}: not a Flight Recorder dump (expected a map with a list 'entries')")
    return dump


def backend_of(profiling_names: Iterable[str]) -> str | None:
    """The backend the entries name (``nccl:all_reduce`` -> nccl), or None when they name several."""
    names = {name.split(":", 1)[0] for name in profiling_names if ":" in name}
    return names.pop() if len(names) == 1 else None


def read_fr_dump(path: Path, rank: int) -> FrDump:
    """Read and check one dump completely; raises BadInput naming the file and the problem."""
    check_input_file(path)
    raw = path.read_bytes()
    dump = parse_dump(raw, str(path))
    entries = []
    for index, entry in enumerate(dump["entries"]):
        try:
            entries.append(entry_from_dump(entry))
        except PayloadError as exc:
            raise BadInput(f"{path}: entry {index}: {exc}") from None
    backend = backend_of(e["profiling_name"] for e in entries)
    return FrDump(path=path, rank=rank, entries=entries, groups=groups_from_pg_config(dump.get("pg_config"), backend),
                  status=status_from_pg_status(dump.get("pg_status")), backend=backend,
                  session_id=content_session_id(path.name, raw))


def entry_from_dump(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One dump entry in rankstream's field names; raises PayloadError if it is not an FR entry."""
    if not isinstance(entry, Mapping):
        raise PayloadError(f"an FR entry must be a map, got {type(entry).__name__}")
    out = {name: entry.get(name) for name in DUMP_FIELDS}
    group = entry.get("process_group")
    if isinstance(group, (list, tuple)) and len(group) >= 1:
        out["pg_name"] = str(group[0])
        out["pg_desc"] = str(group[1]) if len(group) > 1 else None
    else:
        out["pg_name"] = out["pg_desc"] = None
    for name in _TIMES:
        if not out[name]:
            out[name] = None
    if out["thread_id"] is not None:
        out["thread_id"] = str(out["thread_id"])
    frames = entry.get("frames")
    out["frames"] = [
        {"name": f.get("name"), "filename": f.get("filename"), "line": f.get("line")}
        for f in frames if isinstance(f, Mapping)
    ] if isinstance(frames, list) else None
    if type(out["record_id"]) is not int or not isinstance(out["profiling_name"], str):
        raise PayloadError("an FR entry needs an integer record_id and a string profiling_name")
    return out


def _ranks(value: Any) -> list[int] | None:
    if isinstance(value, str):
        parsed = _ranks_text(value)
        return None if parsed is None else list(parsed)
    return value if _is_rank_list(value) else None


def _is_rank_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(r) is int for r in value)


@functools.lru_cache(maxsize=4096)
def _ranks_text(text: str) -> tuple[int, ...] | None:
    """NCCL dumps write each group's ranks as JSON text, and every rank's dump repeats every group:
    at 2,048 ranks, decoding them once per distinct text instead of once per dump saves seconds."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return tuple(value) if _is_rank_list(value) else None


def groups_from_pg_config(pg_config: Any, backend: str | None = None) -> list[dict[str, Any]]:
    """Process groups from a dump's ``pg_config``; the nameless placeholder gloo writes is skipped."""
    if not isinstance(pg_config, Mapping):
        return []
    groups = []
    for key, group in pg_config.items():
        if not isinstance(group, Mapping):
            continue
        name = str(group.get("name") or key or "")
        if not name:
            continue
        groups.append({"pg_name": name, "pg_desc": group.get("desc") or None,
                       "ranks": _ranks(group.get("ranks")), "backend": backend})
    return groups


def status_from_pg_status(pg_status: Any) -> dict[str, dict[str, int]]:
    """``{group: {"last_enqueued": n, "last_started": n, "last_completed": n}}`` with integers."""
    if not isinstance(pg_status, Mapping):
        return {}
    out = {}
    for group, status in pg_status.items():
        if not isinstance(status, Mapping):
            continue
        values = {}
        for key in ("last_enqueued_collective", "last_started_collective", "last_completed_collective"):
            try:
                values[key.removesuffix("_collective")] = int(status.get(key))
            except (TypeError, ValueError):
                continue
        out[str(group)] = values
    return out


def list_fr_files(directory: Path, prefix: str = "rank", selected_ranks: set[int] | None = None) -> list[tuple[int, Path]]:
    """``(rank, path)`` of every dump in ``directory``, the way fr_trace names them (``<prefix><rank>``)."""
    if not directory.is_dir():
        raise BadInput(f"{directory}: not a directory")
    pattern = re.compile(re.escape(prefix) + r"(\d+)$")
    found = []
    for path in sorted(directory.iterdir()):
        if not path.name.startswith(prefix):
            continue
        match = pattern.match(path.name)
        if match is None:
            raise BadInput(f"{path}: cannot tell the rank from the file name (expected {prefix}<rank>)")
        rank = int(match.group(1))
        if selected_ranks is None or rank in selected_ranks:
            found.append((rank, path))
    if not found:
        raise BadInput(f"{directory}: no dump files starting with {prefix!r}")
    return found


def read_fr_directory(directory: Path, prefix: str = "rank", selected_ranks: set[int] | None = None) -> list[FrDump]:
    return [read_fr_dump(path, rank) for rank, path in list_fr_files(directory, prefix, selected_ranks)]
