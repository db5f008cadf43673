"""torch's Flight Recorder dump layout, translated to rankstream's FR fields.

Used by both the live tap and the importer, so live and imported entries are identical. Handles
what real dumps do (torch 2.x, NCCL and gloo, pickle and JSON):

* ``process_group`` is a ``(name, desc)`` tuple (pickle) or a list (JSON);
* JSON dumps write 0 for an unknown "discovered" time where pickle writes None: both become NULL;
* ``thread_id`` may be an int or a string;
* ``pg_config`` maps a group name to ``{"name", "desc", "ranks"}`` where ``ranks`` is a JSON text
  (``"[0, 1]"``) or a list; gloo dumps often carry one bogus ``""`` group with ``"[]"``;
* ``pg_status`` maps a group to its last enqueued/started/completed collective, as strings.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Mapping

from rankstream.schemas.fields import PayloadError
from rankstream.schemas.records import FR_FIELDS

__all__ = ["entry_from_dump", "groups_from_pg_config", "status_from_pg_status", "DUMP_FIELDS"]

#: Fields copied as they are (same name in torch's dump and in rankstream).
DUMP_FIELDS = tuple(name for name in FR_FIELDS if name not in ("pg_name", "pg_desc"))
_TIMES = ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns")


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
