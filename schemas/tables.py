"""Every materialized table, declared once: the projections of the bus and the materializer's
bookkeeping. The analyses' result tables are in ``schemas.analysis_tables``; views and macros
over all of them in ``views.sql``.

Every table is a projection that a replay of the topics rebuilds (``rankstream consume
--rebuild``). Data tables carry run_id and rank. Times are epoch nanoseconds (BIGINT) so they
join without conversion; wrap them in ``make_timestamp_ns()`` for display.
"""

from __future__ import annotations

import hashlib
from importlib import resources

from rankstream.schemas.analysis_tables import ANALYSIS_TABLES
from rankstream.schemas.columns import Column as C
from rankstream.schemas.columns import Table

__all__ = ["TRACE_EVENTS", "FR_ENTRIES", "PROCESS_GROUPS", "HEARTBEATS", "HEARTBEAT_COUNTERS", "RANK_METADATA", "REJECTS", "INPUT_REJECTS", "REMOVED_RUNS", "TABLES", "table",
           "PROJECTION_TABLES", "BOOKKEEPING_TABLES", "ddl", "SCHEMA_VERSION", "EXISTING_COLUMNS_SQL",
           "SILENT_AFTER_S"]

_RUN, _RANK = C("run_id", "VARCHAR", not_null=True), C("rank", "INTEGER", not_null=True)

TRACE_EVENTS = Table("trace_events", "One row per trace event (profiler ops, user spans, instants, counters, step markers).", (
    _RUN, _RANK,
    C("name", "VARCHAR"), C("cat", "VARCHAR"),
    C("ph", "VARCHAR", "Chrome trace phase: X, B, E, i, C, M, s, f, ..."),
    C("ts_ns", "BIGINT"), C("dur_ns", "BIGINT"), C("pid", "BIGINT"), C("tid", "BIGINT"),
    C("step", "BIGINT", "training step (ProfilerStep#N or rankstream.step()), NULL if unknown"),
    C("flow_id", "BIGINT"), C("correlation_id", "BIGINT"),
    C("args", "VARCHAR", "JSON text; query with args->>'$.key'"),
))

FR_ENTRIES = Table("fr_entries", "One row per Flight Recorder entry state seen (an entry sent again with a new state "
                   "adds a row; fr_entries_latest keeps the newest per record).", (
    _RUN, _RANK,
    C("snapshot_ns", "BIGINT", "when the rank's ring was read"),
    C("record_id", "BIGINT", not_null=True, wire="required"),
    C("pg_id", "BIGINT", wire="optional"),
    C("pg_name", "VARCHAR", "process group name (torch's process_group[0])", wire="optional"),
    C("pg_desc", "VARCHAR", "process group description, e.g. default_pg (process_group[1])", wire="optional"),
    C("thread_name", "VARCHAR", wire="optional"),
    C("thread_id", "VARCHAR", wire="optional"),
    C("collective_seq_id", "BIGINT", wire="optional"),
    C("p2p_seq_id", "BIGINT", wire="optional"),
    C("op_id", "BIGINT", wire="optional"),
    C("profiling_name", "VARCHAR", "e.g. nccl:all_reduce, gloo:broadcast, nccl:send 0->1", not_null=True,
      wire="required"),
    C("time_created_ns", "BIGINT", wire="optional"),
    C("time_discovered_started_ns", "BIGINT", wire="optional"),
    C("time_discovered_completed_ns", "BIGINT", wire="optional"),
    C("input_sizes", "BIGINT[][]", wire="optional"),
    C("input_dtypes", "VARCHAR[]", wire="optional"),
    C("output_sizes", "BIGINT[][]", wire="optional"),
    C("output_dtypes", "VARCHAR[]", wire="optional"),
    C("state", "VARCHAR", "scheduled, started or completed", wire="optional"),
    C("retired", "BOOLEAN", wire="optional"),
    C("timeout_ms", "BIGINT", wire="optional"),
    C("is_p2p", "BOOLEAN", wire="optional"),
    C("frames", "STRUCT(name VARCHAR, filename VARCHAR, line BIGINT)[]", "Python stack, innermost first", wire="optional"),
    C("sizes_key", "UBIGINT", "hash of input_sizes and output_sizes: equal sizes, equal keys",
      derived="hash(input_sizes, output_sizes)"),
    C("dtypes_key", "UBIGINT", "hash of input_dtypes and output_dtypes", derived="hash(input_dtypes, output_dtypes)"),
))

PROCESS_GROUPS = Table("process_groups", "Process groups as each rank reported them.", (
    _RUN, _RANK,
    C("reported_ns", "BIGINT"),
    C("pg_name", "VARCHAR", not_null=True, wire="required"),
    C("pg_desc", "VARCHAR", wire="optional"),
    C("ranks", "INTEGER[]", "NULL when the backend did not list them", wire="optional"),
    C("backend", "VARCHAR", wire="optional"),
))

#: The producer's counters that every heartbeat carries.
_COUNTERS = ("events_emitted", "events_sent", "events_spooled", "events_dropped", "bytes_sent", "buffered_events",
             "spool_bytes")
#: Every producer counter a heartbeat carries (the stats ``Producer.stats`` gives), the later ones optional.
HEARTBEAT_COUNTERS = _COUNTERS + ("broker_resets", "events_resent", "events_not_resent", "send_failures",
                                  "windows_lost", "transfers")
HEARTBEATS = Table("heartbeats", "One row per producer heartbeat (about one per second per rank), with its counters.", (
    _RUN, _RANK,
    C("session_id", "VARCHAR", not_null=True), C("sent_ns", "BIGINT", not_null=True),
    *(C(name, "BIGINT", wire="required") for name in _COUNTERS),
    C("final", "BOOLEAN", "sent by close(): the rank said goodbye", wire="required"),
    C("collectives", "VARCHAR", "JSON: last enqueued/started/completed collective per group", wire="optional"),
    C("collectives_read_ns", "BIGINT", "when the rank read that progress: its ring held no later call then",
      wire="optional"),
    C("broker_resets", "BIGINT", "broker restarts the producer noticed (it lost its log each time)", wire="optional"),
    C("events_resent", "BIGINT", "events resent from the resend window after those restarts", wire="optional"),
    C("events_not_resent", "BIGINT", "events the window's byte cap had let go: lost if never consumed", wire="optional"),
    C("send_failures", "BIGINT", "sends the broker failed transiently (the messages were kept and sent again)",
      wire="optional"),
    C("windows_lost", "BIGINT", "profiler windows lost: dropped while the converter was behind, or failed",
      wire="optional"),
    C("transfers", "BIGINT", "point-to-point calls (send, recv, isend, irecv) the job returned from: gloo records "
      "none in the Flight Recorder", wire="optional"),
))

RANK_METADATA = Table("rank_metadata", "Every rank-metadata message (a rank sends it again with each clock-sync sample).", (
    _RUN, _RANK,
    C("world_size", "INTEGER"),
    C("session_id", "VARCHAR", not_null=True), C("sent_ns", "BIGINT", not_null=True),
    C("host", "VARCHAR", wire="required"), C("pid", "BIGINT", wire="required"),
    C("started_at_ns", "BIGINT", wire="required"),
    C("local_rank", "INTEGER", wire="optional"), C("node_rank", "INTEGER", wire="optional"),
    C("local_world_size", "INTEGER", wire="optional"),
    C("torch_version", "VARCHAR", wire="optional"), C("backend", "VARCHAR", wire="optional"),
    C("backend_version", "VARCHAR", wire="optional"),
    C("clock_sync_ns", "BIGINT", wire="optional"), C("clock_error_ns", "BIGINT", wire="optional"),
    C("metadata", "VARCHAR", "JSON given to the producer by the user", wire="optional"),
    C("clock_round", "INTEGER", "which clock-sync round clock_sync_ns belongs to (same on every rank)",
      wire="optional"),
))

REJECTS = Table("rejects", "Messages that could not be decoded or validated: where they were and why. raw holds the "
                "exact bytes, so nothing is lost.", (
    C("topic", "VARCHAR", not_null=True), C("partition", "INTEGER", not_null=True),
    C("kafka_offset", "BIGINT", not_null=True), C("message_key", "BLOB"), C("message_ts_ms", "BIGINT"),
    C("run_id", "VARCHAR"), C("rank", "INTEGER"), C("reason", "VARCHAR", not_null=True), C("raw", "BLOB"),
))

INGESTED_BATCHES = Table("ingested_batches", "One row per accepted message, written in the same transaction as its "
                         "rows: a resend of a batch (same key) is skipped.", (
    _RUN, _RANK,
    C("stream", "VARCHAR", not_null=True), C("session_id", "VARCHAR", not_null=True),
    C("seq", "BIGINT", not_null=True), C("kind", "VARCHAR", not_null=True), C("events", "BIGINT", not_null=True),
    C("topic", "VARCHAR", not_null=True), C("partition", "INTEGER", not_null=True),
    C("kafka_offset", "BIGINT", not_null=True),
    C("digest", "BIGINT", "CRC-32 of a trace batch's events, so a repeat with other events is told from a resend"),
))

BUS_INCARNATION = Table("bus_incarnation", "The topic ids of the broker incarnation the offsets belong to: a broker "
                        "that lost its log recreates the topics with new ids and restarts offsets at 0.", (
    C("topic", "VARCHAR"), C("topic_id", "VARCHAR", not_null=True),
), primary_key=("topic",))

CONSUMER_OFFSETS = Table("consumer_offsets", "The next offset to read per partition.", (
    C("topic", "VARCHAR", not_null=True), C("partition", "INTEGER", not_null=True),
    C("next_offset", "BIGINT", not_null=True),
), primary_key=("topic", "partition"))

INPUT_REJECTS = Table("input_rejects", "Items of imported files that failed validation, while the rest of the file "
                      "was imported: the file, the item's index in it, why, and the item itself as JSON.", (
    _RUN, _RANK,
    C("source", "VARCHAR", "the file", wire="required"),
    C("item", "BIGINT", "the entry's or event's index in the file", wire="required"),
    C("reason", "VARCHAR", "the field and what is wrong with it", wire="required"),
    C("raw", "VARCHAR", "the item as JSON (cut at 64 kB)", wire="optional"),
))

REMOVED_RUNS = Table("removed_runs", "Runs `rankstream gc` removed: their rows are gone from every table, and the "
                     "materializer skips any message of theirs that is read again (a resend, a spool, a rebuild).", (
    C("run_id", "VARCHAR"), C("removed_ns", "BIGINT", not_null=True),
    C("started_ns", "BIGINT", "when the run had started"), C("world_size", "INTEGER"),
    C("rows_removed", "BIGINT", not_null=True), C("reason", "VARCHAR", not_null=True),
), primary_key=("run_id",))

#: Filled from the bus; a rebuild empties them.
PROJECTION_TABLES = (TRACE_EVENTS, FR_ENTRIES, PROCESS_GROUPS, HEARTBEATS, RANK_METADATA, REJECTS, INPUT_REJECTS)
#: The materializer's own position; a rebuild empties these too.
BOOKKEEPING_TABLES = (INGESTED_BATCHES, BUS_INCARNATION, CONSUMER_OFFSETS)
#: Kept by a rebuild: the bus may still hold removed runs' messages.
RETENTION_TABLES = (REMOVED_RUNS,)
TABLES = PROJECTION_TABLES + BOOKKEEPING_TABLES + ANALYSIS_TABLES + RETENTION_TABLES


def table(name: str) -> Table:
    return next(t for t in TABLES if t.name == name)


def _views() -> str:
    return resources.files("rankstream.schemas").joinpath("views.sql").read_text()


def _script() -> str:
    return "\n".join(table.ddl() for table in TABLES) + "\n" + _views()


#: A run whose ranks have not all said goodbye, and from which nothing was heard for this long
#: (``runs.last_heard_ns``; ranks send a heartbeat every second, even while hung), is over: its
#: ranks were killed or crashed. Status says since when it is silent, and ``serve`` analyses it.
SILENT_AFTER_S = 30

#: Changes whenever a declaration or views.sql does; a database records the version its DDL came from.
SCHEMA_VERSION = hashlib.sha256(_script().encode()).hexdigest()[:16]


def ddl(existing_columns: dict[str, set[str]] | None = None) -> str:
    """The full DDL script (idempotent: every statement is IF NOT EXISTS or OR REPLACE), ending with
    ``rankstream_schema()``, which tells later versions whether the file's macros and views are current.
    ``existing_columns`` (table -> column names already in the file) adds the columns an older
    version did not have, before the views that may read them."""
    upgrades = "".join(table.upgrade_sql(existing_columns[table.name]) for table in TABLES
                       if existing_columns and table.name in existing_columns)
    tables = "\n".join(table.ddl() for table in TABLES)
    return (f"{tables}\n{upgrades}\n{_views()}\n"
            f"CREATE OR REPLACE MACRO rankstream_schema() AS '{SCHEMA_VERSION}';\n")


#: The columns of every table in a database file, for ``ddl(existing_columns=...)``.
EXISTING_COLUMNS_SQL = ("SELECT table_name, list(column_name) FROM duckdb_columns() "
                        "WHERE schema_name = 'main' AND NOT internal GROUP BY table_name")
