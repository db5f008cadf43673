"""Analyses and their output: ``analyze run``, ``analyze trace``, ``report``, ``timeline``, ``merge``, ``check-trace``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from rankstream.cli.app import analyze_app, app, config, console, ranks_option, server_module


@analyze_app.command("run", epilog="Example: rankstream analyze run --run job-42 --only clocks,steps")
def analyze_run_command(
    run: str = typer.Option(..., "--run", help="The run to analyze."),
    only: Optional[str] = typer.Option(None, "--only", help="Only these: clocks, steps, communication, breakdown."),
) -> None:
    """Align clocks, then step, communication and breakdown analyses (and the collective diagnosis
    when the run has Flight Recorder data); results go to their tables."""
    names = [n.strip() for n in only.split(",") if n.strip()] if only else None
    seconds = server_module("flows.pipeline").analyze_everything(config().db_path, run, only=names)
    console.print(f"analyzed {run}: " + ", ".join(f"{k} {v:.2f}s" for k, v in seconds.items()))


@app.command(epilog="Example: rankstream report --run job-42 --compare job-41; "
                     "rankstream report --run job-42 --html -o job-42.html --watch 10")
def report(
    run: str = typer.Option(..., "--run", help="The run to report on."),
    compare: Optional[str] = typer.Option(None, "--compare", help="Another run: what changed from RUN to it."),
    no_refresh: bool = typer.Option(False, "--no-refresh", help="Do not run the analyses again first."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    as_html: bool = typer.Option(False, "--html", help="Write one self-contained HTML page of plots instead."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="With --html: the file (default RUN.html)."),
    watch: Optional[float] = typer.Option(None, "--watch", min=1.0,
                                          help="With --html: rewrite the page every N seconds while the run is "
                                               "live; the page reloads itself."),
) -> None:
    """The run's verdict, steps, slowness, communication and breakdown as text, or as an HTML page."""
    pipeline, reporting = server_module("flows.pipeline"), server_module("flows.report")
    db_path = config().db_path
    if as_html:
        _html_report(run, output or Path(f"{run}.html"), watch=watch, refresh=not no_refresh)
        return
    if output is not None or watch is not None:
        raise typer.BadParameter("-o and --watch go with --html")
    if not no_refresh:
        for name in (run, compare) if compare else (run,):
            pipeline.analyze_everything(db_path, name)
    data = reporting.gather_report(db_path, run)
    comparison = server_module("flows.breakdown").compare_runs(db_path, run, compare) if compare else None
    if as_json:
        sys.stdout.write(json.dumps({"run": run, **data, **({"comparison": comparison} if compare else {})},
                                    default=str) + "\n")
        return
    reporting.render_run_report(run, data, console)
    if compare:
        reporting.render_comparison(run, compare, comparison, console=console)


def _html_report(run: str, out: Path, *, watch: float | None, refresh: bool) -> None:
    """Write the page once, or again every ``watch`` seconds until the run ends (Ctrl-C stops)."""
    import time

    pipeline, page = server_module("flows.pipeline"), server_module("flows.html_report")
    lag = server_module("consumers.materializer").materializer_lag
    db_path = config().db_path
    while True:
        if refresh:
            pipeline.analyze_everything(db_path, run)
        live = watch is not None and page.run_is_live(db_path, run)
        written = page.write_html_report(db_path, run, out, refresh_s=watch if live else None,
                                         ingest_lag=lag(config()))
        console.print(f"wrote {written.path} ({written.bytes / 2**20:,.1f} MB, {written.charts} plot(s), "
                      f"{written.seconds:.1f} s)" + (f"; the run is live: again in {watch:g} s" if live else ""),
                      highlight=False, soft_wrap=True)
        if not live:
            return
        time.sleep(watch)


_STEPS = typer.Option(None, "--steps", help="Only steps a:b (inclusive).")
_WINDOW = typer.Option(None, "--window", help="Only seconds t0:t1 after the first event.")
_MAX_EVENTS = typer.Option(2_000_000, "--max-events", min=1000,
                           help="Past this many events, split the output into files by step range.")


def _one_range(steps: Optional[str], window: Optional[str]) -> None:
    if steps and window:
        raise typer.BadParameter("give --steps or --window, not both")


@app.command(epilog="Example: rankstream timeline --run job-42 -o job-42.json.gz --steps 10:12")
def timeline(
    run: str = typer.Option(..., "--run", help="The run to draw."),
    output: Path = typer.Option(..., "-o", "--output", help="Output file, .json or .json.gz."),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="Only these ranks, e.g. '0,3'."),
    steps: Optional[str] = _STEPS,
    window: Optional[str] = _WINDOW,
    max_events: int = _MAX_EVENTS,
) -> None:
    """Write the run as a Chrome trace (chrome://tracing, Perfetto), all ranks on one clock."""
    _one_range(steps, window)
    selected = ranks_option(ranks)
    result = server_module("flows.timeline").write_timeline(
        config().db_path, run, output, ranks=sorted(selected) if selected else None, steps=steps, window=window,
        max_events=max_events)
    _report_timeline(result, max_events)


def _report_timeline(result, max_events: int) -> None:
    if result.split:
        console.print(f"{result.events:,} events are more than --max-events {max_events:,}: "
                      f"split into {len(result.files)} files by step range")
    for path, (first, last) in zip(result.files, result.step_ranges):
        label = f"steps {first}-{last}" if first is not None else "time slice"
        console.print(f"wrote {path} ({label})")


@app.command("merge", epilog="Example: rankstream merge rank0.json rank1.json -o merged.json")
def merge_command(
    files: list[Path] = typer.Argument(..., help="Per-rank (or merged) Chrome/Kineto/Composer traces."),
    output: Path = typer.Option(..., "-o", "--output", help="Merged trace to write, .json or .json.gz."),
    rank: Optional[int] = typer.Option(None, "--rank", help="The rank of a single file without distributedInfo."),
    steps: Optional[str] = _STEPS,
    window: Optional[str] = _WINDOW,
    max_events: int = _MAX_EVENTS,
) -> None:
    """Merge trace files onto one clock into one Chrome trace, with no broker (Composer's merger, one command)."""
    _one_range(steps, window)
    merged = server_module("flows.merge_traces").merge_trace_files(files, output, rank=rank, steps=steps,
                                                                    window=window, max_events=max_events)
    for info in merged.files:
        who = f"ranks {sorted(info.pids)} (pids)" if info.ranks_from_pid else f"rank {info.rank}"
        console.print(f"{info.path}: {who}, {info.events:,} events")
    for estimate in (e for e in merged.offsets if e["chosen"]):
        error = "" if estimate["error_ns"] is None else f" +- {estimate['error_ns'] / 1000:,.1f} us"
        console.print(f"rank {estimate['rank']}: clock offset {estimate['offset_ns'] / 1000:,.1f} us{error} "
                      f"({estimate['source']})")
    _report_timeline(merged.timeline, max_events)


@app.command("check-trace", epilog="Example: rankstream check-trace merged.json")
def check_trace(files: list[Path] = typer.Argument(..., help="Chrome trace JSON files (.json or .json.gz).")) -> None:
    """Check files against the Chrome trace event format. Exit 1 if any has problems."""
    check = server_module("flows.chrome_trace").check_chrome_trace
    failed = False
    for path in files:
        problems, summary = check(path)
        if problems:
            failed = True
            for problem in problems:
                console.print(f"{path}: {problem}", markup=False)
        else:
            console.print(f"{path}: ok, {summary['events']:,} events, {len(summary['pids'])} processes")
    if failed:
        raise typer.Exit(1)


@analyze_app.command("trace", epilog="Example: rankstream analyze trace rank0.json.gz rank1.json.gz --json")
def analyze_trace_command(
    files: list[Path] = typer.Argument(..., help="Kineto/torch.profiler traces, one file per rank."),
    rank: Optional[int] = typer.Option(None, "--rank", help="The rank of a single file without distributedInfo."),
    keep_last_step: bool = typer.Option(False, "--keep-last-step",
                                        help="Keep the last profiler step (HTA drops it by default)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """GPU temporal breakdown, communication/compute overlap, kernel breakdown, idle time per stream,
    queue length, kernel launches, memory bandwidth and exposed communication per step of trace
    files, by Holistic Trace Analysis's rules, with no broker or database."""
    result = server_module("flows.trace_analysis").analyze_trace_files(files, rank=rank, keep_last_step=keep_last_step)
    if as_json:
        sys.stdout.write(json.dumps({"files": result.files, "note": result.note, "categories": result.categories,
                                     **result.tables}, default=str) + "\n")
        return
    if result.note:
        console.print(result.note, markup=False)
    console.print("events by category: " + ", ".join(f"{cat} {n:,}" for cat, n in result.categories.items()),
                  markup=False)
    for table, rows in result.tables.items():
        _print_rows(table, rows)


#: Past this many rows a table is cut in the text view (``--json`` has them all).
_SHOWN_ROWS = 40


def _print_rows(title: str, rows: list[dict]) -> None:
    from rich.table import Table  # rich comes with typer
    from rich.text import Text

    if len(rows) > _SHOWN_ROWS:
        title = f"{title} (first {_SHOWN_ROWS} of {len(rows):,} rows; --json for all)"
        rows = rows[:_SHOWN_ROWS]
    table = Table(title=title)
    for column in rows[0] if rows else ["(no rows)"]:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(Text(f"{v:.2f}" if isinstance(v, float) else str(v)) for v in row.values()))  # never markup
    console.print(table)
