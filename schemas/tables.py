"""The DuckDB schema of every materialized table, kept beside the wire schemas.

``tables.sql`` is the single source; this module loads it and names the tables that a rebuild
drops and recreates.
"""

from __future__ import annotations

import hashlib
from importlib import resources

__all__ = ["ddl", "SCHEMA_VERSION", "PROJECTION_TABLES", "DERIVED_TABLES", "BOOKKEEPING_TABLES", "VIEWS"]

#: Tables filled from the bus; a rebuild empties them.
PROJECTION_TABLES = ("trace_events", "fr_entries", "process_groups", "heartbeats", "rank_metadata", "rejects")
#: Derived by analyses from the projections; not emptied by a rebuild (the analyses recompute them).
DERIVED_TABLES = ("findings", "live_findings", "clock_offsets", "step_trace", "rank_slowness", "comm_summary",
                  "comm_matrix", "temporal_breakdown", "op_stats", "analyses_done")
#: The materializer's own position; a rebuild empties these too.
BOOKKEEPING_TABLES = ("ingested_batches", "consumer_offsets", "bus_incarnation")
VIEWS = ("ranks", "runs", "fr_entries_latest", "aligned_events")


def _script() -> str:
    return resources.files("rankstream.schemas").joinpath("tables.sql").read_text()


#: Changes whenever tables.sql does; a database records the version its DDL came from.
SCHEMA_VERSION = hashlib.sha256(_script().encode()).hexdigest()[:16]


def ddl() -> str:
    """The full DDL script (idempotent: every statement is IF NOT EXISTS or OR REPLACE), ending with
    ``rankstream_schema()``, which tells later versions whether the file's macros and views are current."""
    return _script() + f"\nCREATE OR REPLACE MACRO rankstream_schema() AS '{SCHEMA_VERSION}';\n"
