"""Writing an analysis's result rows for one run, whoever holds the database.

Every analysis (clocks, steps, communication, breakdown) is a list of SQL statements over one run
that replace that run's rows in its result tables. ``replace_run_rows`` sends them as one
transaction through :func:`rankstream.consumers.query.connect`: to the materializer's query
server while it runs (so a live run is analyzed where its data is, without a file lock), or to the
file itself otherwise. Readers see the old rows or the new ones, never a mix, and a failure
changes nothing. Only table names and run ids travel between tasks, never rows.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Iterable

from rankstream.consumers.query import Database, connect
from rankstream.consumers.query_server import PROCEDURE_PREFIX
from rankstream.schemas.errors import BadInput, QueryError
from rankstream.schemas.tables import EXISTING_COLUMNS_SQL, SCHEMA_VERSION, ddl

__all__ = ["replace_run_rows", "analysis_done", "bind", "require_run", "ensure_schema"]

_PARAMETER = re.compile(r"\$([a-z_][a-z_0-9]*)")


def bind(sql: str, values: dict[str, Any]) -> dict[str, Any] | None:
    """The named parameters ``sql`` uses, from ``values`` (DuckDB refuses unused ones)."""
    used = {name: values[name] for name in _PARAMETER.findall(sql) if name in values}
    return used or None


def require_run(db_path: Path, run_id: str) -> None:
    """Refuse, in one line, a run the database has never seen."""
    database = connect(db_path)
    known = database.fetchall(
        "SELECT (SELECT count(*) FROM rank_metadata WHERE run_id = $1) + "
        "(SELECT count(*) FROM trace_events WHERE run_id = $1) + "
        "(SELECT count(*) FROM fr_entries WHERE run_id = $1)", [run_id])[0][0]
    if not known:
        raise BadInput(f"{db_path}: no data for run {run_id!r} (list runs with: rankstream sql 'FROM runs')")


def ensure_schema(db_path: Path | Database) -> None:
    """Bring a database written by another rankstream version up to this one's tables, views and
    macros (the analyses depend on them), once. A database that does not exist is an error here,
    not a new empty file left behind in the working directory."""
    if not isinstance(db_path, Database) and not Path(db_path).exists():
        raise QueryError(f"{db_path}: no such database yet (start the materializer: rankstream up, "
                         "or import data: rankstream import)")
    database = connect(db_path, read_only=False, wait_s=120)
    try:
        current = database.fetchall("SELECT rankstream_schema()")[0][0] == SCHEMA_VERSION
    except QueryError:
        current = False
    if not current:
        existing = {table: set(columns) for table, columns in database.fetchall(EXISTING_COLUMNS_SQL)}
        database.execute(ddl(existing))


def analysis_done(run_id: str, analysis: str, detail: str | None = None) -> tuple[str, dict[str, Any]]:
    """The statement (and its values) recording that ``analysis`` ran for ``run_id`` just now."""
    return ("INSERT INTO analyses_done VALUES ($run, $analysis, $now, $detail)",
            {"run": run_id, "analysis": analysis, "now": time.time_ns(), "detail": detail})


def replace_run_rows(db_path: Path, run_id: str, analysis: str, *, tables: Iterable[str],
                     statements: Iterable[str], detail: str | None = None, **values: Any) -> None:
    """Delete ``run_id``'s rows from ``tables`` and run ``statements`` (which insert the new rows),
    all in one transaction, then record the analysis in ``analyses_done``. A statement may be a
    ``procedure:NAME`` (see ``consumers.query_server.register_procedure``), called with every value."""
    ensure_schema(db_path)
    # without a materializer, scheduled flows take turns on the file's write lock: wait for it
    database = connect(db_path, read_only=False, wait_s=120)
    values = {"run": run_id, **values}
    script: list[tuple[str, Any]] = [(f"DELETE FROM {table} WHERE run_id = $run", {"run": run_id}) for table in tables]
    script += [(sql, values if sql.startswith(PROCEDURE_PREFIX) else bind(sql, values)) for sql in statements]
    script.append(analysis_done(run_id, analysis, detail))
    database.script(script)
