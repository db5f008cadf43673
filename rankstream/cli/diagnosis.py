"""Collective diagnosis: ``diagnose DIR`` (dumps, no broker) and ``analyze collectives --run R``.

Both print the same report: the verdict and the root cause first, then the evidence and the other
findings; ``--json`` prints one object in the same order. Exit 0 healthy, 1 findings, 2 bad input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from rankstream.cli.app import analyze_app, app, config, console, ranks_option, server_module


def _finish(report, as_json: bool, stack_depth: int) -> None:
    if as_json:
        sys.stdout.write(json.dumps(report.as_json(), default=str) + "\n")
    else:
        for line, style in server_module("flows.diagnosis.render").render_text(report, stack_depth=stack_depth):
            console.print(line, style=style, markup=False, highlight=False)
    raise typer.Exit(report.exit_code)


@app.command(epilog="Example: rankstream diagnose /tmp/fr_dumps --prefix rank_ --json")
def diagnose(
    directory: Path = typer.Argument(..., help="Folder of per-rank Flight Recorder dumps (pickle or JSON)."),
    prefix: str = typer.Option("rank", "--prefix", "-p", help="File name prefix before the rank, as fr_trace's."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object."),
    selected_ranks: Optional[str] = typer.Option(None, "--selected-ranks", help="Only these ranks, e.g. '0,3'."),
    pg_filters: Optional[str] = typer.Option(None, "--pg-filters", help="Only these groups (names or descs)."),
    allow_incomplete: bool = typer.Option(False, "--allow-incomplete-ranks",
                                          help="Accepted for fr_trace's users: missing dumps are always diagnosed."),
    mismatch_cap: Optional[int] = typer.Option(None, "--mismatch-cap", help="Report at most N findings."),
    just_print: bool = typer.Option(False, "-j", "--just-print-entries", help="Print every rank's calls."),
    stack_traces: bool = typer.Option(False, "--print-stack-trace", help="Show more of the culprits' stacks."),
) -> None:
    """Find which rank broke the job in Flight Recorder dumps (a drop-in for torch's fr_trace):
    desyncs, hangs, deadlocks, missing ranks and stragglers."""
    report_module = server_module("flows.diagnosis.report")
    filters = {g.strip() for g in pg_filters.split(",")} if pg_filters else None
    if just_print:
        loader = server_module("flows.diagnosis.loader")
        loaded = loader.load_directory(directory, prefix, selected_ranks=ranks_option(selected_ranks),
                                       pg_filters=filters)
        rows = server_module("flows.diagnosis.listing").calls_table(loaded.entries)
        server_module("cli.data").print_table(rows, "json" if as_json else "table")
        return
    report = report_module.diagnose_directory(directory, prefix=prefix, pg_filters=filters, mismatch_cap=mismatch_cap,
                                              selected_ranks=ranks_option(selected_ranks, "--selected-ranks"))
    _finish(report, as_json, 20 if stack_traces else 6)


@analyze_app.command("collectives", epilog="Example: rankstream analyze collectives --run job-42 --json")
def analyze_collectives(
    run: str = typer.Option(..., "--run", help="The run to diagnose."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object."),
    mismatch_cap: Optional[int] = typer.Option(None, "--mismatch-cap", help="Report at most N findings."),
) -> None:
    """The diagnosis of a stored run (live or imported), with the same report as diagnose, plus the
    episodes the live hang watch recorded."""
    pipeline = server_module("flows.pipeline")
    report, episodes = pipeline.diagnose_run(config().db_path, run, mismatch_cap=mismatch_cap)
    if episodes and not as_json:
        console.print("live episodes (the hang watch, while the run ran):", style="bold")
        for episode in episodes:
            console.print("  " + pipeline.episode_line(episode), markup=False, highlight=False)
    if as_json:
        sys.stdout.write(json.dumps({**report.as_json(), "episodes": episodes}, default=str) + "\n")
        raise typer.Exit(report.exit_code)
    _finish(report, False, 6)
