"""The DuckDB schema of every materialized table, kept beside the wire schemas.

``tables.sql`` is the single source; this module loads it and names the tables that a rebuild
drops and recreates.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["ddl", "PROJECTION_TABLES", "DERIVED_TABLES", "BOOKKEEPING_TABLES", "VIEWS"]

#: Tables filled from the bus; a rebuild empties them.
PROJECTION_TABLES = ("trace_events", "fr_entries", "process_groups", "heartbeats", "rank_metadata", "rejects")
#: Derived by analyses from the projections; not emptied by a rebuild (the analyses recompute them).
DERIVED_TABLES = ("findings", "live_findings")
#: The materializer's own position; a rebuild empties these too.
BOOKKEEPING_TABLES = ("ingested_batches", "consumer_offsets")
VIEWS = ("ranks", "runs", "fr_entries_latest")


def ddl() -> str:
    """The full DDL script (idempotent: every statement is IF NOT EXISTS or OR REPLACE)."""
    return resources.files("rankstream.schemas").joinpath("tables.sql").read_text()
