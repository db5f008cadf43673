"""``rankstream diagnose DIR``: the one-shot drop-in for PyTorch's fr_trace, and the shared report.

A dump directory is read completely (bad files are refused with one line) by the columnar loader
(``flows.dump_loader``, whose rows are those the materializer writes for imported dumps) into
Parquet files that a temporary DuckDB reads in place, matched with ``flows.collectives``, and
reported: a rich table for people, or with ``--json`` exactly one JSON object on stdout.
``rankstream analyze collectives --run RUN`` gives the same report for data already in the database.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import duckdb

from rankstream.schemas.errors import RankstreamError
from rankstream.flows.collectives import (INSERT_FINDINGS_JSON_SQL, Finding, build_collective_tables, findings_for_run,
                                          findings_rows, store_findings, verdict)
from rankstream.flows.run_tables import analysis_done, replace_run_rows
from rankstream.schemas.tables import ddl

#: DuckDB's memory limit for a one-shot diagnosis: past it, derived tables spill to the scratch file.
_MEMORY_LIMIT = "500MB"

__all__ = ["Report", "analyze_run", "analyze_stored", "diagnose_directory", "render_report"]


@dataclass
class Report:
    run_id: str
    verdict: str
    findings: list[Finding]
    ranks: list[int]
    missing_ranks: list[int]

    def as_json(self) -> dict:
        return {"verdict": self.verdict, "findings": [f.as_json() for f in self.findings]}

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "healthy" else 1


def analyze_run(con: duckdb.DuckDBPyConnection, run_id: str, mismatch_cap: int | None = None,
                allow_incomplete: bool = False, **layout: bool) -> Report:
    """``layout``: what ``build_collective_tables`` may be told instead of scanning for it."""
    build_collective_tables(con, run_id, **layout)
    findings = findings_for_run(con, run_id, mismatch_cap)
    store_findings(con, run_id, findings)
    ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM collective_calls WHERE run_id = ? ORDER BY rank",
                                       [run_id]).fetchall()]
    expected = {r for (r,) in con.execute("SELECT DISTINCT rank FROM memberships WHERE run_id = ?",
                                          [run_id]).fetchall()}
    missing = sorted(expected - set(ranks))
    return Report(run_id, verdict(findings, incomplete=bool(missing) and not allow_incomplete), findings, ranks,
                  missing)


def diagnose_directory(directory: Path, *, prefix: str = "rank", selected_ranks: set[int] | None = None,
                       pg_filters: set[str] | None = None, allow_incomplete: bool = False,
                       mismatch_cap: int | None = None, with_frames: bool = False
                       ) -> tuple[Report, duckdb.DuckDBPyConnection]:
    """Load a dump directory into a temporary DuckDB and analyze it (see the module docstring).

    The dumps become Parquet files in a scratch directory (removed when the process exits), which
    ``fr_entries`` reads in place; the derived tables go to a DuckDB file there, under a memory
    limit, so memory stays bounded however many dumps there are."""
    import pyarrow as pa

    from rankstream.flows.dump_loader import write_dump_parquet

    run_id = f"fr-{directory.resolve().name}"
    scratch = _scratch_directory()
    loaded = write_dump_parquet(directory, prefix, run_id, scratch, selected_ranks=selected_ranks,
                                with_frames=with_frames)
    con = duckdb.connect(str(scratch / "diagnose.duckdb"))
    con.execute(f"SET memory_limit = '{_MEMORY_LIMIT}'")
    con.execute("PRAGMA disable_checkpoint_on_shutdown")  # a scratch file: nothing to keep
    con.execute("SET preserve_insertion_order = false")  # the queries order what they return; saves memory
    con.execute(ddl())
    if loaded.parquet_files:
        con.execute("SET VARIABLE entry_files = $files", {"files": [str(f) for f in loaded.parquet_files]})
        con.execute("SET VARIABLE pg_filters = $filters", {"filters": sorted(pg_filters or [])})
        con.execute("DROP TABLE fr_entries")
        con.execute("""
            CREATE VIEW fr_entries AS SELECT * FROM read_parquet(getvariable('entry_files'))
            WHERE len(getvariable('pg_filters')) = 0 OR list_contains(getvariable('pg_filters'), pg_name)
               OR list_contains(getvariable('pg_filters'), pg_desc)
        """)
    if loaded.groups:
        groups = loaded.groups
        con.register("_groups", pa.table({
            "run_id": [run_id] * len(groups), "rank": pa.array([g["rank"] for g in groups], pa.int32()),
            "reported_ns": pa.array([0] * len(groups), pa.int64()), "pg_name": [g["pg_name"] for g in groups],
            "pg_desc": [g["pg_desc"] for g in groups], "ranks": pa.array([g["ranks"] for g in groups],
                                                                         pa.list_(pa.int32())),
            "backend": [g["backend"] for g in groups]}))
        con.execute("INSERT INTO process_groups SELECT * FROM _groups")
        con.unregister("_groups")
    try:
        report = analyze_run(con, run_id, mismatch_cap, allow_incomplete, repeats=loaded.repeated_records,
                             coalesced=loaded.coalesced)
    except duckdb.OutOfMemoryException as exc:
        raise RankstreamError(f"{directory}: the analysis ran out of its {_MEMORY_LIMIT} of working memory "
                              f"({str(exc).splitlines()[0]})") from exc
    return report, con


def _scratch_directory() -> Path:
    """A private temporary directory that lives until the process exits (the returned connection
    reads from it)."""
    path = Path(tempfile.mkdtemp(prefix="rankstream-diagnose-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def analyze_stored(db_path: Path, run_id: str, mismatch_cap: int | None = None) -> Report:
    """Analyze a run already in the database.

    When no other process holds the file, the analysis runs in it and its tables (memberships,
    collective_calls, collectives, findings) stay there for SQL. While a materializer holds it, the
    run's FR rows are copied through the query server into a private in-memory database and only
    the report comes back.
    """
    from rankstream.consumers.query import connect
    from rankstream.consumers.query_server import server_socket
    from rankstream.schemas.errors import BadInput

    database = connect(db_path)
    if not database.fetchall("SELECT count(*) FROM fr_entries WHERE run_id = ?", [run_id])[0][0]:
        raise BadInput(f"{db_path}: run {run_id!r} has no Flight Recorder entries")
    if server_socket(db_path) is None:
        try:
            con = duckdb.connect(str(db_path))
        except duckdb.IOException:
            con = None
        if con is not None:
            try:
                report = analyze_run(con, run_id, mismatch_cap)
                con.execute(*analysis_done(run_id, "collectives", report.verdict))
                return report
            finally:
                con.close()
    con = duckdb.connect()
    con.execute(ddl())
    for table in ("fr_entries", "process_groups"):
        con.register("_rows", database.arrow(f"SELECT * FROM {table} WHERE run_id = ?", [run_id]))
        con.execute(f"INSERT INTO {table} SELECT * FROM _rows")
        con.unregister("_rows")
    report = analyze_run(con, run_id, mismatch_cap)
    # the findings go back to the live database (timeline markers, SQL); the rest stays private
    replace_run_rows(db_path, run_id, "collectives", ["findings"], [INSERT_FINDINGS_JSON_SQL],
                     detail=report.verdict, rows=json.dumps(findings_rows(run_id, report.findings)))
    return report


def render_report(report: Report, console, *, stack_traces: bool = False, con=None) -> None:
    from rich.table import Table

    style = {"healthy": "green", "straggler": "yellow"}.get(report.verdict, "red")
    console.print(f"[bold {style}]{report.verdict.upper()}[/]: {len(report.findings)} finding(s) over ranks "
                  f"{report.ranks}" + (f"; no data from ranks {report.missing_ranks}" if report.missing_ranks else ""))
    if not report.findings:
        return
    table = Table("#", "kind", "group", "seq", "culprit ranks", "expected", "actual", "detail", show_lines=True)
    for index, finding in enumerate(report.findings, 1):
        table.add_row(str(index), finding.kind, f"{finding.group} ({finding.group_desc})",
                      "" if finding.seq is None else str(finding.seq), str(finding.culprit_ranks),
                      _short(finding.expected), _short(finding.actual), finding.detail)
    console.print(table)
    if stack_traces and con is not None:
        for finding in report.findings:
            for rank in finding.culprit_ranks:
                row = con.execute("SELECT frames FROM collective_calls WHERE run_id = ? AND pg_name = ? AND rank = ? "
                                  "AND seq <= coalesce(?, seq) ORDER BY seq DESC LIMIT 1",
                                  [report.run_id, finding.group, rank, finding.seq]).fetchone()
                if row and row[0]:
                    console.print(f"rank {rank}, {finding.kind} in group {finding.group}:")
                    for frame in row[0][:15]:
                        console.print(f"    {frame['filename']}:{frame['line']} {frame['name']}", markup=False)


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
