"""Commands that bring data in, get it out and remove it: ``import fr``, ``import trace``, ``sql``, ``gc``."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from rankstream.cli.app import app, config, console, import_app, server_module


def _report_import(summary) -> None:
    ranks = ", ".join(f"rank {r}: {n:,}" for r, n in sorted(summary.ranks.items()))
    console.print(f"imported into run {summary.run_id!r}: {ranks} ({summary.messages} messages)")
    if summary.rejected:
        console.print(f"[yellow]{summary.rejected} item(s) failed validation and were not imported: "
                      f"rankstream sql \"SELECT * FROM input_rejects WHERE run_id = '{summary.run_id}'\"[/]")
        raise typer.Exit(1)


@import_app.command("fr", epilog="Example: rankstream import fr dumps/ --prefix rank_ --run job-42")
def import_fr_command(
    directory: Path = typer.Argument(..., help="Folder of per-rank Flight Recorder dumps (pickle or JSON)."),
    prefix: str = typer.Option("rank", "--prefix", "-p", help="File name prefix before the rank, as fr_trace's."),
    run: Optional[str] = typer.Option(None, "--run", help="Run id to file the data under (default fr-<folder>)."),
) -> None:
    """Import per-rank FR dumps (NCCL or gloo, torch 2.x); pickles are read without running code."""
    _report_import(server_module("consumers.imports").import_fr(config(), directory, prefix=prefix, run_id=run))


@import_app.command("trace", epilog="Example: rankstream import trace rank0.json rank1.json.gz --run job-42")
def import_trace_command(
    files: list[Path] = typer.Argument(..., help="Chrome/Kineto trace files (.json or .json.gz)."),
    run: Optional[str] = typer.Option(None, "--run", help="Run id to file the data under."),
    rank: Optional[int] = typer.Option(None, "--rank", help="The rank of a single file without distributedInfo."),
) -> None:
    """Import torch.profiler / Kineto, Composer and generic Chrome traces, streamed."""
    _report_import(server_module("consumers.imports").import_traces(config(), files, run_id=run, rank=rank))


def print_table(table, output: str) -> None:
    rows = table.to_pylist()
    if output == "json":
        sys.stdout.write(json.dumps(rows, default=str) + "\n")
    elif output == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(table.column_names)
        writer.writerows([[row[name] for name in table.column_names] for row in rows])
    else:
        view = Table(*table.column_names, show_lines=False)
        for row in rows:
            view.add_row(*[Text("" if v is None else str(v)) for v in row.values()])  # values, never markup
        console.print(view)
        console.print(f"{table.num_rows} row(s)", style="dim")


@app.command(epilog="Example: rankstream sql \"SELECT rank, count(*) FROM trace_events GROUP BY rank\"")
def sql(
    query: str = typer.Argument(..., help="SQL to run."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as one JSON array."),
    as_csv: bool = typer.Option(False, "--csv", help="Print the rows as CSV."),
    write: bool = typer.Option(False, "--write", help="Allow statements that change the database."),
    param: list[str] = typer.Option([], "--param", "-p", help="A value for the next ? placeholder."),
    timeout: float = typer.Option(60.0, "--timeout", min=0.1, help="Stop the query after this many seconds."),
) -> None:
    """Run SQL against the database, live: through the materializer while it runs. Without
    --write only reads run, and no statement can reach the host's files."""
    database = server_module("consumers.query").connect(config().db_path, read_only=not write, timeout_s=timeout)
    table = (database.execute if write else database.arrow)(query, param or None)
    print_table(table, "json" if as_json else "csv" if as_csv else "table")


@app.command(epilog="Example: rankstream gc --keep-runs 20 --older-than 30 --dry-run")
def gc(
    keep_runs: Optional[int] = typer.Option(None, "--keep-runs", min=0, help="Keep only the N most recent runs."),
    older_than: Optional[float] = typer.Option(None, "--older-than", min=0,
                                               help="Remove the runs started more than DAYS days ago."),
    timeline_dir: list[Path] = typer.Option([], "--timeline-dir",
                                            help="Also remove the runs' timeline files in this folder."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be removed; remove nothing."),
) -> None:
    """Remove old runs: their rows in every table, their spools, report and timeline files. A
    tombstone stays (the run is listed in `runs` with removed_at), and a run in progress is kept."""
    removals = server_module("flows.retention").collect_garbage(
        config(), keep_runs=keep_runs, older_than_days=older_than, timeline_dirs=timeline_dir, dry_run=dry_run)
    for removal in removals:
        console.print(removal.line(dry_run))
    if not removals:
        console.print("nothing to remove")
