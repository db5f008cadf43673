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
from itertools import chain, repeat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from rankstream.producers.importing import check_input_file, content_session_id, item_as_json
from rankstream.producers.json_position import first_problem
from rankstream.schemas.errors import BadInput
from rankstream.schemas.fields import PayloadError, check_record
from rankstream.schemas.records import FR_FIELDS
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
    #: Entries that failed validation, as ``input_rejects`` rows (the others are imported).
    rejects: list[dict[str, Any]] = field(default_factory=list)


def parse_dump(raw: bytes, source: str, *, entries: bool = True) -> dict[str, Any]:
    """A dump's bytes (pickle or JSON) as a map; raises BadInput naming ``source`` and the problem.
    ``entries=False`` accepts the progress-only dumps the live tap asks for."""
    try:
        if raw.lstrip()[:1] in (b"{", b"["):
            try:
                dump = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                problem = first_problem(raw)
                raise BadInput(f"{source}: not valid JSON "
                               + (problem.describe() if problem else f"({str(exc)[:200]})")) from None
        else:
            dump = safe_loads(raw)
    except UnsafePickle as exc:
        raise BadInput(f"{source}: {exc}") from None
    if not isinstance(dump, dict) or (entries and not isinstance(dump.get("entries"), list)):
        raise BadInput(f"{source}: not a Flight Recorder dump (expected a map with a list 'entries')")
    if isinstance(dump.get("entries"), list):
        _check_expansion(dump["entries"], len(raw), source)
    return dump


#: The fields of an entry that the readers walk into: the sizes, lists of lists, down to their
#: integers; the others only one level (their items are scalars, checked by type, never walked).
_NESTED, _FLAT = ("input_sizes", "output_sizes"), ("input_dtypes", "output_dtypes", "frames", "process_group")


def expansion_limit(size_bytes: int) -> int:
    """How many elements a dump of ``size_bytes`` may expand to. Every element costs at least one
    byte of a pickle unless it is a shared reference; torch shares only a few (repeated stack
    frames), so 16 per byte plus a margin is far above any real dump and far below a pickle bomb."""
    return 2_000_000 + 16 * size_bytes


def _check_expansion(entries: list, size_bytes: int, source: str) -> None:
    """Refuse a dump whose shared references expand past ``expansion_limit`` (a pickle bomb of a
    few hundred bytes can name 10^13 sizes; Arrow alone would spend hours formatting the error).
    The walk goes level by level and stops at the limit, so it costs at most that many steps; on a
    dump of torch's layout it runs in C (``map``, ``chain``) without building lists."""
    limit = expansion_limit(size_bytes)
    plain = set(map(type, entries)) <= {dict}
    total = len(entries)
    for name in _NESTED + _FLAT:
        values = (list(map(dict.get, entries, repeat(name))) if plain
                  else [e.get(name) if isinstance(e, dict) else None for e in entries])
        total += _expanded_size(values, name in _NESTED, limit - total)
        if total > limit:
            raise BadInput(f"{source}: its shared references expand to more than {limit:,} elements "
                           f"(in {name!r}): refused")


_SCALARS = {int, str, float, bool, type(None)}


def _expanded_size(values: list, nested: bool, budget: int) -> int:
    """Elements under the containers in ``values`` (down to scalars when ``nested``), counted until
    past ``budget``. The fast path assumes torch's layout (every value a container, sizes holding
    lists of integers); anything else takes the slow, filtering path."""
    try:
        total = sum(map(len, values))
        if not nested or total > budget:
            return total
        inner = list(chain.from_iterable(values))  # at most ``budget`` items
        total += sum(map(len, inner))
        if total > budget or set(map(type, chain.from_iterable(inner))) <= _SCALARS:
            return total
    except TypeError:  # None or scalars where containers were expected
        pass
    total, level = 0, [v for v in values if isinstance(v, (list, tuple, dict))]
    while level:
        total += sum(map(len, level))
        if total > budget or not nested:
            return total
        level = [v for v in chain.from_iterable(level) if isinstance(v, (list, tuple, dict))]  # <= budget items
    return total


def backend_of(profiling_names: Iterable[str]) -> str | None:
    """The backend the entries name (``nccl:all_reduce`` -> nccl), or None when they name several."""
    names = {name.split(":", 1)[0] for name in profiling_names if ":" in name}
    return names.pop() if len(names) == 1 else None


def read_fr_dump(path: Path, rank: int) -> FrDump:
    """Read and check one dump completely; raises BadInput naming the file and the problem."""
    check_input_file(path)
    raw = path.read_bytes()
    dump = parse_dump(raw, str(path))
    entries, rejects = [], []
    for index, entry in enumerate(dump["entries"]):
        try:
            entries.append(check_record(entry_from_dump(entry), FR_FIELDS, "FR entry"))
        except PayloadError as exc:
            rejects.append({"source": str(path), "item": index, "reason": f"entry {index}: {exc}",
                            "raw": item_as_json(entry)})
    if dump["entries"] and not entries:
        raise BadInput(f"{path}: {rejects[0]['reason']} (none of its {len(rejects)} entries is valid)")
    backend = backend_of(e["profiling_name"] for e in entries)
    return FrDump(path=path, rank=rank, entries=entries, groups=groups_from_pg_config(dump.get("pg_config"), backend),
                  status=status_from_pg_status(dump.get("pg_status")), backend=backend,
                  session_id=content_session_id(path.name, raw), rejects=rejects)


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
