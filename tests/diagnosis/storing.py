"""A generated case's dumps stored as the materializer stores imported dumps (for the stored-run
and live doors of the diagnosis, without a broker)."""

from __future__ import annotations

import json

import pyarrow as pa

from rankstream.consumers.store import insert_arrow
from rankstream.producers.fr_reader import entry_from_dump, groups_from_pg_config
from rankstream.schemas.tables import FR_ENTRIES
from tests.diagnosis.fr_scenarios import dump_documents

#: The columns the bus fills (the derived keys are computed at insert).
_FR_SCHEMA = pa.schema([f for f in FR_ENTRIES.arrow_schema() if not FR_ENTRIES.column(f.name).derived])


def store_case(con, case, run_id: str = "run", now_ns: int | None = None) -> None:
    """Insert ``case``'s entries and groups under ``run_id``; with ``now_ns``, also heartbeats of
    every rank that has a dump, alive and without progress for a minute."""
    store_dumps(con, dump_documents(case), run_id, now_ns)


def store_dumps(con, dumps: dict[int, dict], run_id: str = "run", now_ns: int | None = None) -> None:
    """``store_case`` for dump documents (rank -> a dump's ``entries`` and ``pg_config``)."""
    rows, groups = [], []
    for rank, dump in dumps.items():
        rows += [{"run_id": run_id, "rank": rank, "snapshot_ns": now_ns or 1, **entry_from_dump(entry)}
                 for entry in dump["entries"]]
        groups += [{"run_id": run_id, "rank": rank, "reported_ns": 1, **g}
                   for g in groups_from_pg_config(dump.get("pg_config"))]
        if now_ns is not None:
            for sent in (now_ns - 60 * 10**9, now_ns - 10**9):
                con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final, collectives) "
                            "VALUES (?, ?, 's', ?, false, ?)", [run_id, rank, sent, json.dumps({"0": {"last": 1}})])
    insert_arrow(con, "fr_entries", pa.Table.from_pylist(rows, schema=_FR_SCHEMA))
    if groups:
        con.register("_groups", pa.Table.from_pylist(groups))
        con.execute("INSERT INTO process_groups BY NAME SELECT * FROM _groups")
        con.unregister("_groups")
