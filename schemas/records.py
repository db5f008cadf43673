"""Low-volume payloads: Flight Recorder entries, process groups, rank metadata and heartbeats.

These are row-oriented maps (tens of messages per second per rank at most), validated against
field specs derived from the tables they fill (``schemas.tables``). Field names are rankstream's
own: the FR reader translates torch's dump layout (e.g. ``process_group: (name, desc)``) into
``pg_name``/``pg_desc`` before sending.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rankstream.schemas.columns import Table
from rankstream.schemas.fields import (
    Checker,
    PayloadError,
    boolean,
    check_record,
    integer,
    json_object,
    list_of,
    text,
)
from rankstream.schemas.tables import (FR_ENTRIES, HEARTBEAT_COUNTERS, HEARTBEATS, INPUT_REJECTS, PROCESS_GROUPS,
                                       RANK_METADATA)

__all__ = ["FrBatch", "PgConfig", "RankMeta", "Heartbeat", "InputRejects", "FR_FIELDS", "HEARTBEAT_COUNTERS", "wire_spec"]

MAX_RECORDS = 100_000


def _frame(value: Any) -> dict:
    return check_record(value, {"name": (text, False), "filename": (text, False), "line": (integer, False)}, "frame")


def _thread_id(value: Any) -> str:
    if type(value) in (int, str):
        return str(value)
    raise PayloadError(f"expected an integer or string, got {type(value).__name__}")


#: How a payload value of each column type is checked.
_CHECKERS = {
    "BIGINT": integer, "INTEGER": integer, "VARCHAR": text, "BOOLEAN": boolean,
    "BIGINT[][]": list_of(list_of(integer)), "VARCHAR[]": list_of(text), "INTEGER[]": list_of(integer),
    "STRUCT(name VARCHAR, filename VARCHAR, line BIGINT)[]": list_of(_frame),
}
#: Payload fields whose value is richer than the column that stores it: a thread id may be an int
#: (torch's pickles) or a string; the JSON columns arrive as maps and are stored as text.
_OVERRIDES = {"thread_id": _thread_id, "metadata": json_object, "collectives": json_object}


def wire_spec(table: Table) -> dict[str, tuple[Checker, bool]]:
    """``{field: (checker, required)}`` of the payload that fills ``table``, from its declaration."""
    return {c.name: (_OVERRIDES.get(c.name) or _CHECKERS[c.type], c.wire == "required")
            for c in table.wire_columns()}


#: Every Flight Recorder field that rankstream keeps, with its checker and whether it is required.
FR_FIELDS = wire_spec(FR_ENTRIES)
_GROUP = wire_spec(PROCESS_GROUPS)
_RANK_META = wire_spec(RANK_METADATA)
_HEARTBEAT = wire_spec(HEARTBEATS)
_INPUT_REJECT = wire_spec(INPUT_REJECTS)


def _records(wire: Any, key: str, what: str) -> list:
    if not isinstance(wire, dict) or not isinstance(wire.get(key), list):
        raise PayloadError(f"{what}: expected a map with a list {key!r}")
    if len(wire[key]) > MAX_RECORDS:
        raise PayloadError(f"{what}: more than {MAX_RECORDS} records in one message")
    return wire[key]


@dataclass(frozen=True, slots=True)
class FrBatch:
    """New or changed Flight Recorder entries of one rank, from one snapshot of its ring buffer."""

    snapshot_ns: int
    entries: list[dict[str, Any]]

    def to_wire(self) -> dict[str, Any]:
        return {"snapshot_ns": self.snapshot_ns, "entries": self.entries}

    @classmethod
    def from_wire(cls, wire: Any) -> "FrBatch":
        entries = [check_record(e, FR_FIELDS, "fr entry") for e in _records(wire, "entries", "fr batch")]
        snapshot = check_record(wire, {"snapshot_ns": (integer, True)}, "fr batch")["snapshot_ns"]
        return cls(snapshot_ns=snapshot, entries=entries)




@dataclass(frozen=True, slots=True)
class PgConfig:
    """The process groups a rank knows of. ``ranks`` is None when the backend does not say."""

    groups: list[dict[str, Any]]

    def to_wire(self) -> dict[str, Any]:
        return {"groups": self.groups}

    @classmethod
    def from_wire(cls, wire: Any) -> "PgConfig":
        return cls(groups=[check_record(g, _GROUP, "process group") for g in _records(wire, "groups", "pg config")])




@dataclass(frozen=True, slots=True)
class RankMeta:
    """Who a rank is (host, pid, versions) plus its latest clock-sync sample."""

    fields: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return dict(self.fields)

    @classmethod
    def from_wire(cls, wire: Any) -> "RankMeta":
        return cls(fields=check_record(wire, _RANK_META, "rank metadata"))




@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Proof of life plus the producer's own counters; ``final`` is set by ``close()``."""

    fields: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return dict(self.fields)

    @classmethod
    def from_wire(cls, wire: Any) -> "Heartbeat":
        return cls(fields=check_record(wire, _HEARTBEAT, "heartbeat"))


@dataclass(frozen=True, slots=True)
class InputRejects:
    """Items of an imported file that failed validation (``source``, ``item``, ``reason``, ``raw``):
    the importer publishes the rest and these, so nothing of the file is lost silently."""

    rows: list[dict[str, Any]]

    def to_wire(self) -> dict[str, Any]:
        return {"rows": self.rows}

    @classmethod
    def from_wire(cls, wire: Any) -> "InputRejects":
        return cls(rows=[check_record(r, _INPUT_REJECT, "input reject") for r in _records(wire, "rows", "input rejects")])
