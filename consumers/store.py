"""The DuckDB store: rows, rejects, batch keys and offsets, committed together.

``write`` applies one poll in ONE transaction: it skips messages whose batch key is already in
``ingested_batches`` (producer resends, restarts, spool replays), inserts the projected rows and
the rejects, records the new batch keys and advances ``consumer_offsets``. A crash anywhere before
COMMIT leaves the database as it was and the materializer re-reads the same offsets, so every
message is applied exactly once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import duckdb
import numpy as np
import pyarrow as pa

from rankstream.consumers.projector import project
from rankstream.consumers.source import Record
from rankstream.errors import DatabaseBusy, RankstreamError
from rankstream.schemas.codec import DecodeFailure, decode
from rankstream.schemas.envelope import Envelope
from rankstream.schemas.tables import BOOKKEEPING_TABLES, PROJECTION_TABLES, ddl
from rankstream.schemas.topics import parse_message_key

__all__ = ["Store", "WriteResult", "open_writable"]


@dataclass
class WriteResult:
    messages: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    events: int = 0
    rows: dict[str, int] = field(default_factory=dict)


def open_writable(path: Path, wait_s: float = 0.0) -> duckdb.DuckDBPyConnection:
    """Open the DuckDB file for writing, retrying while another process holds it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return duckdb.connect(str(path))
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise RankstreamError(f"{path}: cannot open the database: {exc}") from exc
            if time.monotonic() >= deadline:
                raise DatabaseBusy(f"{path} is held by another process ({_holder(exc)}); "
                                   "stop it or query through it") from exc
            time.sleep(0.2)


def _holder(exc: Exception) -> str:
    text = str(exc)
    marker = "(PID "
    return "pid " + text[text.index(marker) + 5:].split(")")[0] if marker in text else "unknown pid"


class Store:
    """Owns a write connection to the DuckDB file. Not thread-safe: use ``cursor()`` from other threads."""

    def __init__(self, connection: duckdb.DuckDBPyConnection) -> None:
        self.connection = connection
        connection.execute(ddl())

    def cursor(self) -> duckdb.DuckDBPyConnection:
        return self.connection.cursor()

    def offsets(self) -> dict[tuple[str, int], int]:
        rows = self.connection.execute("SELECT topic, partition, next_offset FROM consumer_offsets").fetchall()
        return {(topic, partition): offset for topic, partition, offset in rows}

    def reset(self) -> None:
        """Empty every projection and the stored offsets: the next read starts at offset 0."""
        con = self.connection
        con.execute("BEGIN")
        for table in PROJECTION_TABLES + BOOKKEEPING_TABLES:
            con.execute(f"DELETE FROM {table}")
        con.execute("COMMIT")
        con.execute("CHECKPOINT")

    def write(self, records: list[Record]) -> WriteResult:
        result = WriteResult(messages=len(records))
        if not records:
            return result
        accepted: list[tuple[Record, Envelope]] = []
        rejects: list[dict] = []
        seen: set = set()
        for record in records:
            decoded = decode(record.value)
            if isinstance(decoded, DecodeFailure):
                rejects.append(_reject_row(record, decoded))
            elif decoded.key in seen:
                result.duplicates += 1
            else:
                seen.add(decoded.key)
                accepted.append((record, decoded))
        con = self.connection
        con.execute("BEGIN")
        try:
            fresh = self._drop_known(accepted)
            result.duplicates += len(accepted) - len(fresh)
            envelopes = [envelope for _, envelope in fresh]
            for table, arrow in project(envelopes).items():
                self._insert(table, arrow)
                result.rows[table] = arrow.num_rows
            if rejects:
                self._insert("rejects", pa.Table.from_pylist(rejects, schema=_REJECT_SCHEMA))
            if fresh:
                self._insert("ingested_batches", _batch_keys(fresh))
            self._advance(records)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        result.accepted = len(fresh)
        result.rejected = len(rejects)
        result.events = result.rows.get("trace_events", 0)
        return result

    def _insert(self, table: str, arrow: pa.Table) -> None:
        name = f"_incoming_{table}"
        self.connection.register(name, arrow)
        try:
            self.connection.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {name}")
        finally:
            self.connection.unregister(name)

    def _drop_known(self, accepted: list[tuple[Record, Envelope]]) -> list[tuple[Record, Envelope]]:
        if not accepted:
            return []
        keys = pa.table({
            "idx": np.arange(len(accepted), dtype=np.int64),
            "run_id": [e.run_id for _, e in accepted],
            "rank": np.array([e.rank for _, e in accepted], dtype=np.int32),
            "stream": [e.stream.value for _, e in accepted],
            "session_id": [e.session_id for _, e in accepted],
            "seq": np.array([e.seq for _, e in accepted], dtype=np.int64),
        })
        self.connection.register("_candidate_keys", keys)
        try:
            known = self.connection.execute(
                "SELECT c.idx FROM _candidate_keys c SEMI JOIN ingested_batches b "
                "ON b.run_id = c.run_id AND b.rank = c.rank AND b.stream = c.stream "
                "AND b.session_id = c.session_id AND b.seq = c.seq"
            ).fetchall()
        finally:
            self.connection.unregister("_candidate_keys")
        if not known:
            return accepted
        skip = {idx for (idx,) in known}
        return [pair for i, pair in enumerate(accepted) if i not in skip]

    def _advance(self, records: list[Record]) -> None:
        next_offsets: dict[tuple[str, int], int] = {}
        for r in records:
            position = (r.topic, r.partition)
            next_offsets[position] = max(next_offsets.get(position, 0), r.offset + 1)
        table = pa.table({
            "topic": [t for t, _ in next_offsets],
            "partition": pa.array([p for _, p in next_offsets], pa.int32()),
            "next_offset": pa.array(list(next_offsets.values()), pa.int64()),
        })
        self.connection.register("_offsets", table)
        try:
            self.connection.execute("INSERT OR REPLACE INTO consumer_offsets SELECT * FROM _offsets")
        finally:
            self.connection.unregister("_offsets")


_REJECT_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("kafka_offset", pa.int64()),
    ("message_key", pa.binary()), ("message_ts_ms", pa.int64()), ("run_id", pa.string()),
    ("rank", pa.int32()), ("reason", pa.string()), ("raw", pa.binary()),
])


def _reject_row(record: Record, failure: DecodeFailure) -> dict:
    key_run, key_rank = parse_message_key(record.key)
    return {
        "topic": record.topic, "partition": record.partition, "kafka_offset": record.offset,
        "message_key": record.key, "message_ts_ms": record.timestamp_ms,
        "run_id": failure.run_id or key_run,
        "rank": failure.rank if failure.rank is not None and abs(failure.rank) < 2**31 else key_rank,
        "reason": failure.reason, "raw": record.value,
    }


def _batch_keys(fresh: list[tuple[Record, Envelope]]) -> pa.Table:
    return pa.table({
        "run_id": [e.run_id for _, e in fresh],
        "rank": pa.array([e.rank for _, e in fresh], pa.int32()),
        "stream": [e.stream.value for _, e in fresh],
        "session_id": [e.session_id for _, e in fresh],
        "seq": pa.array([e.seq for _, e in fresh], pa.int64()),
        "kind": [e.kind.value for _, e in fresh],
        "events": pa.array([getattr(e.payload, "count", 0) for _, e in fresh], pa.int64()),
        "topic": [r.topic for r, _ in fresh],
        "partition": pa.array([r.partition for r, _ in fresh], pa.int32()),
        "kafka_offset": pa.array([r.offset for r, _ in fresh], pa.int64()),
    })


def summarize_lag(end_offsets: Mapping[tuple[str, int], int], stored: Mapping[tuple[str, int], int]) -> int:
    """Messages on the bus that are not in DuckDB yet."""
    return sum(max(0, end - stored.get(position, 0)) for position, end in end_offsets.items())
