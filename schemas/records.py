"""Low-volume payloads: Flight Recorder entries, process groups, rank metadata and heartbeats.

These are row-oriented maps (tens of messages per second per rank at most), validated against
field specs. Field names are rankstream's own: the FR tap and the FR importer translate torch's
dump layout (e.g. ``process_group: (name, desc)``) into ``pg_name``/``pg_desc`` before sending.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rankstream.schemas.fields import (
    PayloadError,
    boolean,
    check_record,
    integer,
    json_object,
    list_of,
    text,
)

__all__ = ["FrBatch", "PgConfig", "RankMeta", "Heartbeat", "FR_FIELDS", "HEARTBEAT_COUNTERS", "RECOVERY_COUNTERS"]

MAX_RECORDS = 100_000


def _frame(value: Any) -> dict:
    return check_record(value, {"name": (text, False), "filename": (text, False), "line": (integer, False)}, "frame")


def _thread_id(value: Any) -> str:
    if type(value) in (int, str):
        return str(value)
    raise PayloadError(f"expected an integer or string, got {type(value).__name__}")


_sizes = list_of(list_of(integer))
_dtypes = list_of(text)

#: Every Flight Recorder field that rankstream keeps, with its checker and whether it is required.
FR_FIELDS = {
    "record_id": (integer, True),
    "pg_id": (integer, False),
    "pg_name": (text, False),
    "pg_desc": (text, False),
    "thread_name": (text, False),
    "thread_id": (_thread_id, False),
    "collective_seq_id": (integer, False),
    "p2p_seq_id": (integer, False),
    "op_id": (integer, False),
    "profiling_name": (text, True),
    "time_created_ns": (integer, False),
    "time_discovered_started_ns": (integer, False),
    "time_discovered_completed_ns": (integer, False),
    "input_sizes": (_sizes, False),
    "input_dtypes": (_dtypes, False),
    "output_sizes": (_sizes, False),
    "output_dtypes": (_dtypes, False),
    "state": (text, False),
    "retired": (boolean, False),
    "timeout_ms": (integer, False),
    "is_p2p": (boolean, False),
    "frames": (list_of(_frame), False),
}

HEARTBEAT_COUNTERS = (
    "events_emitted",
    "events_sent",
    "events_spooled",
    "events_dropped",
    "bytes_sent",
    "buffered_events",
    "spool_bytes",
)

#: Broker-restart counters (see ``producers.delivery``); optional, as older producers lack them.
RECOVERY_COUNTERS = ("broker_resets", "events_resent", "events_not_resent")


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


_GROUP = {
    "pg_name": (text, True),
    "pg_desc": (text, False),
    "ranks": (list_of(integer), False),
    "backend": (text, False),
}


@dataclass(frozen=True, slots=True)
class PgConfig:
    """The process groups a rank knows of. ``ranks`` is None when the backend does not say."""

    groups: list[dict[str, Any]]

    def to_wire(self) -> dict[str, Any]:
        return {"groups": self.groups}

    @classmethod
    def from_wire(cls, wire: Any) -> "PgConfig":
        return cls(groups=[check_record(g, _GROUP, "process group") for g in _records(wire, "groups", "pg config")])


_RANK_META = {
    "host": (text, True),
    "pid": (integer, True),
    "started_at_ns": (integer, True),
    "local_rank": (integer, False),
    "node_rank": (integer, False),
    "local_world_size": (integer, False),
    "torch_version": (text, False),
    "backend": (text, False),
    "backend_version": (text, False),
    "clock_sync_ns": (integer, False),
    "clock_error_ns": (integer, False),
    "clock_round": (integer, False),
    "metadata": (json_object, False),
}


@dataclass(frozen=True, slots=True)
class RankMeta:
    """Who a rank is (host, pid, versions) plus its latest clock-sync sample."""

    fields: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return dict(self.fields)

    @classmethod
    def from_wire(cls, wire: Any) -> "RankMeta":
        return cls(fields=check_record(wire, _RANK_META, "rank metadata"))


_HEARTBEAT = {name: (integer, True) for name in HEARTBEAT_COUNTERS} | {
    name: (integer, False) for name in RECOVERY_COUNTERS} | {
    "final": (boolean, True),
    "collectives": (json_object, False),
}


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Proof of life plus the producer's own counters; ``final`` is set by ``close()``."""

    fields: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return dict(self.fields)

    @classmethod
    def from_wire(cls, wire: Any) -> "Heartbeat":
        return cls(fields=check_record(wire, _HEARTBEAT, "heartbeat"))
