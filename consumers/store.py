"""The DuckDB store: rows, rejects, batch keys and offsets, committed together.

A poll is applied in two steps. ``prepare`` decodes and projects it into Arrow tables without
touching the database (so the materializer can prepare the next poll while this one commits).
``Store.commit`` then applies it in ONE transaction: it skips messages whose batch key is already
in ``ingested_batches`` (producer resends, restarts, spool replays), inserts the projected rows
and the rejects, records the new batch keys and advances ``consumer_offsets``. A crash anywhere before
COMMIT leaves the database as it was and the materializer re-reads the same offsets, so every
message is applied exactly once.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from rankstream.consumers.prepare import PreparedBatch, conflict_reason, prepare, same_content
from rankstream.consumers.projector import MESSAGE_COLUMN
from rankstream.schemas.topics import Record
from rankstream.schemas.errors import DatabaseBusy, RankstreamError, StorageUnavailable
from rankstream.schemas.tables import BOOKKEEPING_TABLES, EXISTING_COLUMNS_SQL, PROJECTION_TABLES, REJECTS, ddl
from rankstream.schemas.tables import table as declared_table

__all__ = ["Store", "WriteResult", "open_writable", "transaction", "insert_arrow", "apply_schema"]


@dataclass
class WriteResult:
    messages: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    events: int = 0
    rows: dict[str, int] = field(default_factory=dict)


@contextlib.contextmanager
def transaction(connection: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """BEGIN ... COMMIT, rolled back on any error. DuckDB's I/O failures (a full disk) come out as
    :class:`StorageUnavailable`, which the materializer retries. The error raised is the one that
    broke the transaction: a failing ROLLBACK must not replace it with a vaguer one."""
    connection.execute("BEGIN")
    try:
        yield connection
        connection.execute("COMMIT")
    except _STORAGE_FAILURES as exc:
        _roll_back(connection)
        raise StorageUnavailable(f"write failed: {type(exc).__name__}: {exc}") from exc
    except BaseException:
        _roll_back(connection)
        raise


#: DuckDB errors that say the storage, not the data, failed: a later attempt can succeed.
_STORAGE_FAILURES = (duckdb.IOException, duckdb.OutOfMemoryException)


def _roll_back(connection: duckdb.DuckDBPyConnection) -> None:
    try:
        connection.execute("ROLLBACK")
    except duckdb.Error:  # the connection is already unusable; the caller raises the error that broke it
        return


@contextlib.contextmanager
def _registered(connection: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> Iterator[None]:
    """An Arrow table visible to SQL as ``name`` for the block. Unregistering fails in an aborted
    transaction; that failure is dropped so the error that aborted it is the one raised."""
    connection.register(name, table)
    try:
        yield
    finally:
        try:
            connection.unregister(name)
        except duckdb.Error:
            pass


def insert_arrow(connection: duckdb.DuckDBPyConnection, name: str, arrow: pa.Table) -> None:
    """Append an Arrow table's rows to table ``name``, its columns matched by name, its derived
    columns (``schemas.columns.Column.derived``) computed."""
    with _registered(connection, f"_incoming_{name}", arrow):
        connection.execute(declared_table(name).insert_sql(f"_incoming_{name}", set(arrow.column_names)))


def apply_schema(connection: duckdb.DuckDBPyConnection) -> None:
    """Create the tables, views and macros, adding the columns a file from an older version lacks."""
    existing = {table: set(columns) for table, columns in connection.execute(EXISTING_COLUMNS_SQL).fetchall()}
    connection.execute(ddl(existing))


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
        apply_schema(connection)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        return self.connection.cursor()

    def offsets(self) -> dict[tuple[str, int], int]:
        rows = self.connection.execute("SELECT topic, partition, next_offset FROM consumer_offsets").fetchall()
        return {(topic, partition): offset for topic, partition, offset in rows}

    def stored_sequences(self, senders: list[tuple[str, int, str, str]]) -> dict[tuple[str, int, str, str], list[int]]:
        """The sequence numbers stored for each ``(run, rank, stream, session)`` of ``senders``."""
        found: dict[tuple[str, int, str, str], list[int]] = {}
        if not senders:
            return found
        rows = self.connection.execute(
            "SELECT b.run_id, b.rank, b.stream, b.session_id, b.seq FROM ingested_batches b JOIN "
            "(SELECT unnest($runs) AS run_id, unnest($ranks) AS rank, unnest($streams) AS stream, "
            "unnest($sessions) AS session_id) s USING (run_id, rank, stream, session_id)",
            {"runs": [s[0] for s in senders], "ranks": [s[1] for s in senders],
             "streams": [s[2] for s in senders], "sessions": [s[3] for s in senders]}).fetchall()
        for run_id, rank, stream, session_id, seq in rows:
            found.setdefault((run_id, rank, stream, session_id), []).append(seq)
        return found

    def incarnation(self) -> dict[str, str]:
        """The topic ids of the broker incarnation the stored offsets belong to."""
        return dict(self.connection.execute("SELECT topic, topic_id FROM bus_incarnation").fetchall())

    def adopt_incarnation(self, topic_ids: Mapping[str, str], *, forget_offsets: bool) -> None:
        """Record the broker's topic ids; with ``forget_offsets`` (a new incarnation) also drop the
        stored offsets, in the same transaction, so a crash cannot pair old offsets with the new log."""
        with transaction(self.connection) as con:
            if forget_offsets:
                con.execute("DELETE FROM consumer_offsets")
            con.execute("DELETE FROM bus_incarnation")
            for topic, topic_id in topic_ids.items():
                con.execute("INSERT INTO bus_incarnation VALUES (?, ?)", [topic, topic_id])

    def reset(self) -> None:
        """Empty every projection and the stored offsets: the next read starts at offset 0."""
        con = self.connection
        con.execute("BEGIN")
        for table in PROJECTION_TABLES + BOOKKEEPING_TABLES:
            con.execute(f"DELETE FROM {table.name}")
        con.execute("COMMIT")
        con.execute("CHECKPOINT")

    def write(self, records: list[Record]) -> WriteResult:
        """Decode, project and commit one poll (``prepare`` then ``commit``)."""
        return self.commit(prepare(records))

    def commit(self, batch: "PreparedBatch") -> WriteResult:
        """Apply a prepared poll in one transaction: rows, rejects, batch keys and offsets."""
        result = WriteResult(messages=batch.messages, rejected=len(batch.rejects))
        if not batch.messages:
            return result
        with transaction(self.connection):
            known, conflicts = self._known_messages(batch.keys)
            conflicting = [batch.conflict_reject(index, reason) for index, reason in conflicts.items()]
            resends = len(known) - len(conflicts)
            for index, record in batch.repeats:  # in-poll copies share their first copy's fate
                if index in conflicts:
                    conflicting.append(batch.conflict_reject(index, conflicts[index], record))
                else:
                    resends += 1
            result.duplicates = resends
            result.rejected += len(conflicting)
            for table, arrow in batch.tables.items():
                arrow = _without_messages(arrow, known)
                if arrow.num_rows:
                    self._insert(table, arrow)
                result.rows[table] = arrow.num_rows
            if batch.rejects or conflicting:
                self._insert_rejects(pa.Table.from_pylist(batch.rejects + conflicting, schema=_REJECT_SCHEMA))
            keys = _without_messages(batch.keys, known)
            if keys.num_rows:
                self._insert("ingested_batches", keys)
            self._advance(batch.next_offsets)
        result.accepted = batch.keys.num_rows - len(known)
        result.events = result.rows.get("trace_events", 0)
        return result

    def _insert_rejects(self, arrow: pa.Table) -> None:
        """Rejects not stored yet: one row per message at its coordinates, however often it is
        read (the same bytes at the same topic, partition and offset). The stored rejects are
        looked up by coordinates first, within the poll's offsets (row groups outside them are
        skipped unread): their raw bytes, up to megabytes each, are compared only on a reread,
        never scanned for every poll."""
        columns = ", ".join(arrow.column_names)
        offsets = pc.min_max(arrow["kafka_offset"])
        bounds = [offsets["min"].as_py(), offsets["max"].as_py()]
        with _registered(self.connection, "_incoming_rejects", arrow):
            reread = self.connection.execute(
                "SELECT count(*) FROM rejects r SEMI JOIN _incoming_rejects i USING (topic, partition, kafka_offset) "
                "WHERE r.kafka_offset BETWEEN $1 AND $2", bounds).fetchone()[0]
            unseen = ("" if not reread else
                      " WHERE NOT EXISTS (SELECT 1 FROM rejects r WHERE r.kafka_offset BETWEEN $1 AND $2 "
                      "AND r.topic = i.topic AND r.partition = i.partition AND r.kafka_offset = i.kafka_offset "
                      "AND r.raw IS NOT DISTINCT FROM i.raw)")
            self.connection.execute(f"INSERT INTO rejects ({columns}) SELECT {columns} FROM _incoming_rejects i"
                                    + unseen, bounds if reread else [])

    def _insert(self, table: str, arrow: pa.Table) -> None:
        if MESSAGE_COLUMN in arrow.column_names:
            arrow = arrow.drop_columns([MESSAGE_COLUMN])
        insert_arrow(self.connection, table, arrow)

    def _known_messages(self, keys: pa.Table) -> tuple[set[int], dict[int, str]]:
        """Indexes (within the poll) of messages whose batch key is already stored, or whose run
        ``rankstream gc`` removed, and among them the conflicting repeats (a different kind or event
        count under the same key) with a reason."""
        if not keys.num_rows:
            return set(), {}
        with _registered(self.connection, "_candidate_keys", keys):
            known = self.connection.execute(
                f"SELECT c.{MESSAGE_COLUMN}, b.kind, b.events, b.digest, c.kind, c.events, c.digest FROM _candidate_keys c "
                "JOIN ingested_batches b ON b.run_id = c.run_id AND b.rank = c.rank AND b.stream = c.stream "
                "AND b.session_id = c.session_id AND b.seq = c.seq"
            ).fetchall()
            removed = self.connection.execute(
                f"SELECT c.{MESSAGE_COLUMN} FROM _candidate_keys c SEMI JOIN removed_runs USING (run_id)").fetchall()
        conflicts = {index: conflict_reason((kind, events, digest), (c_kind, c_events, c_digest))
                     for index, kind, events, digest, c_kind, c_events, c_digest in known
                     if not same_content((kind, events, digest), (c_kind, c_events, c_digest))}
        return {index for index, *_ in known} | {index for index, in removed}, conflicts

    def _advance(self, next_offsets: dict[tuple[str, int], int]) -> None:
        table = pa.table({
            "topic": [t for t, _ in next_offsets],
            "partition": pa.array([p for _, p in next_offsets], pa.int32()),
            "next_offset": pa.array(list(next_offsets.values()), pa.int64()),
        })
        with _registered(self.connection, "_offsets", table):
            self.connection.execute("INSERT OR REPLACE INTO consumer_offsets SELECT * FROM _offsets")


_REJECT_SCHEMA = REJECTS.arrow_schema()


def _without_messages(table: pa.Table, messages: set[int]) -> pa.Table:
    if not messages:
        return table
    import pyarrow.compute as pc  # here, not at the top: one-shot commands that never drop messages skip its import

    drop = pc.is_in(table[MESSAGE_COLUMN], value_set=pa.array(sorted(messages), pa.int32()))
    return table.filter(pc.invert(drop))


def summarize_lag(end_offsets: Mapping[tuple[str, int], int], stored: Mapping[tuple[str, int], int]) -> int:
    """Messages on the bus that are not in DuckDB yet."""
    return sum(max(0, end - stored.get(position, 0)) for position, end in end_offsets.items())
