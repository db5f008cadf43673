"""The ``rankstream`` command line.

Every command resolves one :class:`~rankstream.schemas.config.Config` from its flags, the environment and
the config file. Errors are printed as one line (``rankstream: error: ...``) with exit code 2;
tracebacks are for bugs only.
"""

from __future__ import annotations

import csv
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from rankstream.schemas.config import Config
from rankstream.schemas.settings import load_config
from rankstream.schemas.errors import RankstreamError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Stream PyTorch traces and Flight Recorder entries from every rank into DuckDB.")
broker_app = typer.Typer(no_args_is_help=True, help="The embedded local broker (Tansu on 127.0.0.1).")
app.add_typer(broker_app, name="broker")
import_app = typer.Typer(no_args_is_help=True, help="Backfill files through the bus into the same tables as live data.")
app.add_typer(import_app, name="import")
analyze_app = typer.Typer(no_args_is_help=True, help="Analyses over stored data.")
app.add_typer(analyze_app, name="analyze")

#: Piped output (logs, CI, `| grep`) gets wide lines instead of rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 200)
errors = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


class _State:
    overrides: dict[str, Any] = {}


def config(**extra: Any) -> Config:
    return load_config({**_State.overrides, **{k: v for k, v in extra.items() if v is not None}})


@app.callback()
def _global_options(
    db: Optional[Path] = typer.Option(None, "--db", help="DuckDB file (default ./rankstream.duckdb)."),
    state_dir: Optional[Path] = typer.Option(None, help="Pid files, logs and spool (default ./.rankstream)."),
    bootstrap: Optional[str] = typer.Option(None, help="Kafka bootstrap servers (default: the embedded broker)."),
    topic_prefix: Optional[str] = typer.Option(None, help="Topic name prefix (default rankstream)."),
    broker_port: Optional[int] = typer.Option(None, help="Port of the embedded broker (default 29092)."),
) -> None:
    _State.overrides = {k: v for k, v in {
        "db_path": db, "state_dir": state_dir, "kafka.bootstrap_servers": bootstrap,
        "topic_prefix": topic_prefix, "broker_port": broker_port,
    }.items() if v is not None}


# -- broker ---------------------------------------------------------------------------------------
@broker_app.command("start")
def broker_start() -> None:
    """Start the embedded broker and wait until it answers."""
    from rankstream.services import start_embedded_broker

    state = start_embedded_broker(config())
    console.print(f"broker up: {state.bootstrap} (pid {state.pid}, log {state.log})")


@broker_app.command("stop")
def broker_stop() -> None:
    """Stop the embedded broker (its topics are lost: it keeps them in memory)."""
    from rankstream.deploy.broker import stop_broker

    console.print("broker stopped" if stop_broker(config()) else "no embedded broker was running")


@broker_app.command("status")
def broker_status_command() -> None:
    """Say whether the embedded broker runs, and where."""
    from rankstream.deploy.broker import broker_status

    state = broker_status(config())
    if state is None:
        console.print("embedded broker: not running")
        raise typer.Exit(1)
    console.print(f"embedded broker: running at {state.bootstrap} (pid {state.pid})")


# -- services -------------------------------------------------------------------------------------
@app.command()
def up() -> None:
    """Start the embedded broker (unless a cluster is configured) and a background materializer."""
    from rankstream.services import up as start

    cfg = config()
    services = start(cfg)
    where = services.broker.bootstrap if services.broker else cfg.bootstrap_servers
    console.print(f"up: broker {where}, materializer pid {services.materializer_pid} -> {cfg.db_path}")


@app.command()
def down() -> None:
    """Stop what `rankstream up` started."""
    from rankstream.services import down as stop

    stopped = stop(config())
    console.print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@app.command()
def consume(
    once: bool = typer.Option(False, help="Stop when the offsets seen at start are reached."),
    rebuild: bool = typer.Option(False, help="Empty every table and replay all partitions from offset 0."),
    serve_sql: bool = typer.Option(True, "--serve-sql/--no-serve-sql", help="Serve SQL to other processes."),
    max_messages: int = typer.Option(500, min=1, help="Messages per poll, i.e. per DuckDB transaction."),
) -> None:
    """Materialize the topics into DuckDB in the foreground (Ctrl-C stops cleanly)."""
    from rankstream.services import materialize

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    cfg = config()
    errors.print(f"rankstream consume: {cfg.bootstrap_servers} -> {cfg.db_path}")
    status = materialize(cfg, stop, once=once, rebuild=rebuild, query_server=serve_sql, max_messages=max_messages,
                   log=_log_line)
    errors.print(f"consumed {status.messages} messages, {status.events} events, "
                 f"{status.rejected} rejected, {status.duplicates} duplicates skipped")


def _log_line(line: str) -> None:
    """Service log lines: plain, unwrapped, one per event, for log files and terminals alike."""
    print(line, file=sys.stderr, flush=True)


# -- imports --------------------------------------------------------------------------------------
def _report_import(summary) -> None:
    ranks = ", ".join(f"rank {r}: {n:,}" for r, n in sorted(summary.ranks.items()))
    console.print(f"imported into run {summary.run_id!r}: {ranks} ({summary.messages} messages)")


@import_app.command("fr")
def import_fr_command(
    directory: Path = typer.Argument(..., help="Folder of per-rank Flight Recorder dumps (pickle or JSON)."),
    prefix: str = typer.Option("rank", "--prefix", "-p", help="File name prefix before the rank, as fr_trace's."),
    run: Optional[str] = typer.Option(None, "--run", help="Run id to file the data under (default fr-<folder>)."),
) -> None:
    """Import per-rank FR dumps (NCCL or gloo, torch 2.x); pickles are read without running code."""
    from rankstream.consumers.imports import import_fr

    _report_import(import_fr(config(), directory, prefix=prefix, run_id=run))


@import_app.command("trace")
def import_trace_command(
    files: list[Path] = typer.Argument(..., help="Chrome/Kineto trace files (.json or .json.gz)."),
    run: Optional[str] = typer.Option(None, "--run", help="Run id to file the data under."),
    rank: Optional[int] = typer.Option(None, "--rank", help="The rank of a single file without distributedInfo."),
) -> None:
    """Import torch.profiler / Kineto, Composer and generic Chrome traces, streamed."""
    from rankstream.consumers.imports import import_traces

    _report_import(import_traces(config(), files, run_id=run, rank=rank))


# -- collective diagnosis -----------------------------------------------------------------------
def _ranks(text: Optional[str]) -> Optional[set[int]]:
    if not text:
        return None
    try:
        return {int(part) for part in text.replace(",", " ").split()}
    except ValueError:
        raise typer.BadParameter(f"--selected-ranks takes rank numbers, got {text!r}") from None


def _finish_report(report, as_json: bool, stack_traces: bool = False, con=None) -> None:
    from rankstream.flows.diagnose import render_report

    if as_json:
        sys.stdout.write(json.dumps(report.as_json(), default=str) + "\n")
    else:
        render_report(report, console, stack_traces=stack_traces, con=con)
    raise typer.Exit(report.exit_code)


@app.command()
def diagnose(
    directory: Path = typer.Argument(..., help="Folder of per-rank Flight Recorder dumps (pickle or JSON)."),
    prefix: str = typer.Option("rank", "--prefix", "-p", help="File name prefix before the rank, as fr_trace's."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object."),
    selected_ranks: Optional[str] = typer.Option(None, "--selected-ranks", help="Only these ranks, e.g. '0,3'."),
    pg_filters: Optional[str] = typer.Option(None, "--pg-filters", help="Only these groups (names or descs)."),
    allow_incomplete: bool = typer.Option(False, "--allow-incomplete-ranks", help="Missing dumps are not an error."),
    mismatch_cap: Optional[int] = typer.Option(None, "--mismatch-cap", help="Report at most N mismatches."),
    just_print: bool = typer.Option(False, "-j", "--just-print-entries", help="Print every rank's entries."),
    stack_traces: bool = typer.Option(False, "--print-stack-trace", help="Show the culprits' stack frames."),
) -> None:
    """Find desyncs, hangs and stragglers in FR dumps (drop-in for torch's fr_trace). Exit 0 healthy,
    1 findings, 2 bad input."""
    from rankstream.flows.diagnose import diagnose_directory

    filters = {g.strip() for g in pg_filters.split(",")} if pg_filters else None
    report, con = diagnose_directory(directory, prefix=prefix, selected_ranks=_ranks(selected_ranks),
                                     pg_filters=filters, allow_incomplete=allow_incomplete, mismatch_cap=mismatch_cap,
                                     with_frames=stack_traces)
    if just_print:
        _print_table(con.execute("SELECT rank, pg_name, pg_desc, seq, op, input_sizes, output_sizes, input_dtypes, "
                                 "state FROM collective_calls ORDER BY rank, pg_name, seq").to_arrow_table(),
                     "json" if as_json else "table")
        return
    _finish_report(report, as_json, stack_traces, con)


@analyze_app.command("collectives")
def analyze_collectives(
    run: str = typer.Option(..., "--run", help="The run to analyze."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object."),
    mismatch_cap: Optional[int] = typer.Option(None, "--mismatch-cap", help="Report at most N mismatches."),
) -> None:
    """Collective matching on stored data (live or imported), with the same report as diagnose."""
    from rankstream.flows.diagnose import analyze_stored

    _finish_report(analyze_stored(config().db_path, run, mismatch_cap), as_json)


@analyze_app.command("run")
def analyze_run_command(
    run: str = typer.Option(..., "--run", help="The run to analyze."),
    only: Optional[str] = typer.Option(None, help="Only these analyses: clocks, steps, communication, breakdown."),
) -> None:
    """Merge clocks, then step, communication and breakdown analyses (and collective diagnosis when
    the run has Flight Recorder data); results go to their tables."""
    from rankstream.flows.pipeline import analyze_everything

    names = [n.strip() for n in only.split(",") if n.strip()] if only else None
    seconds = analyze_everything(config().db_path, run, only=names)
    console.print(f"analyzed {run}: " + ", ".join(f"{k} {v:.2f}s" for k, v in seconds.items()))


@app.command()
def report(
    run: str = typer.Argument(..., help="The run to report on."),
    compare: Optional[str] = typer.Option(None, "--compare", help="Another run: show what changed from RUN to it."),
    refresh: bool = typer.Option(True, "--refresh/--no-refresh", help="Re-run the analyses first."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """The run's step, slowness, communication and breakdown analyses as text."""
    from rankstream.flows.breakdown import compare_runs
    from rankstream.flows.pipeline import analyze_everything
    from rankstream.flows.report import gather_report, render_comparison, render_run_report

    db_path = config().db_path
    if refresh:
        for name in (run, compare) if compare else (run,):
            analyze_everything(db_path, name)
    data = gather_report(db_path, run)
    comparison = compare_runs(db_path, run, compare) if compare else None
    if as_json:
        sys.stdout.write(json.dumps({"run": run, **data, **({"comparison": comparison} if compare else {})},
                                    default=str) + "\n")
        return
    render_run_report(run, data, console)
    if compare:
        render_comparison(run, compare, comparison, console)


# -- timelines: options shared by `timeline` and `merge` ------------------------------------------
_STEPS = typer.Option(None, "--steps", help="Only steps a:b (inclusive).")
_WINDOW = typer.Option(None, "--window", help="Only seconds t0:t1 after the first event.")
_MAX_EVENTS = typer.Option(2_000_000, "--max-events", min=1000,
                           help="Past this many events, split the output into files by step range.")


def _one_range(steps: Optional[str], window: Optional[str]) -> None:
    if steps and window:
        raise typer.BadParameter("give --steps or --window, not both")


@app.command()
def timeline(
    run: str = typer.Option(..., "--run", help="The run to draw."),
    output: Path = typer.Option(..., "-o", "--output", help="Output file, .json or .json.gz."),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="Only these ranks, e.g. '0,3'."),
    steps: Optional[str] = _STEPS,
    window: Optional[str] = _WINDOW,
    max_events: int = _MAX_EVENTS,
) -> None:
    """Write the run as a Chrome trace (chrome://tracing, Perfetto), all ranks on one clock."""
    from rankstream.flows.timeline import write_timeline

    _one_range(steps, window)
    result = write_timeline(config().db_path, run, output, ranks=sorted(_ranks(ranks)) if ranks else None,
                            steps=steps, window=window, max_events=max_events)
    _report_timeline(result, max_events)


def _report_timeline(result, max_events: int) -> None:
    if result.split:
        console.print(f"{result.events:,} events are more than --max-events {max_events:,}: "
                      f"split into {len(result.files)} files by step range")
    for path, (first, last) in zip(result.files, result.step_ranges):
        label = f"steps {first}-{last}" if first is not None else "time slice"
        console.print(f"wrote {path} ({label})")


@app.command("merge")
def merge_command(
    files: list[Path] = typer.Argument(..., help="Per-rank (or merged) Chrome/Kineto/Composer traces, .json or .json.gz."),
    output: Path = typer.Option(..., "-o", "--output", help="Merged trace to write, .json or .json.gz."),
    rank: Optional[int] = typer.Option(None, "--rank", help="The rank of a single file without distributedInfo."),
    steps: Optional[str] = _STEPS,
    window: Optional[str] = _WINDOW,
    max_events: int = _MAX_EVENTS,
) -> None:
    """Merge trace files onto one clock into one Chrome trace, with no broker (Composer's merger, one command)."""
    from rankstream.flows.merge_traces import merge_trace_files

    _one_range(steps, window)
    merged = merge_trace_files(files, output, rank=rank, steps=steps, window=window, max_events=max_events)
    for info in merged.files:
        who = f"ranks {sorted(info.pids)} (pids)" if info.ranks_from_pid else f"rank {info.rank}"
        console.print(f"{info.path}: {who}, {info.events:,} events")
    for estimate in (e for e in merged.offsets if e["chosen"]):
        error = "" if estimate["error_ns"] is None else f" +- {estimate['error_ns'] / 1000:,.1f} us"
        console.print(f"rank {estimate['rank']}: clock offset {estimate['offset_ns'] / 1000:,.1f} us{error} "
                      f"({estimate['source']})")
    _report_timeline(merged.timeline, max_events)


@app.command("check-trace")
def check_trace(files: list[Path] = typer.Argument(..., help="Chrome trace JSON files (.json or .json.gz).")) -> None:
    """Check files against the Chrome trace event format. Exit 1 if any has problems."""
    from rankstream.flows.chrome_trace import check_chrome_trace

    failed = False
    for path in files:
        problems, summary = check_chrome_trace(path)
        if problems:
            failed = True
            for problem in problems:
                console.print(f"{path}: {problem}", markup=False)
        else:
            console.print(f"{path}: ok, {summary['events']:,} events, {len(summary['pids'])} processes")
    if failed:
        raise typer.Exit(1)


@app.command("serve")
def serve_command(
    prefect_file: Optional[Path] = typer.Option(None, "--prefect-file", help="Deployments and schedules "
                                                "(default: rankstream's deploy/prefect.yaml)."),
) -> None:
    """Run the analysis flows on their schedules (starts a local Prefect server unless
    PREFECT_API_URL is set; stops it on exit)."""
    from rankstream.schedules import DEFAULT_PREFECT_FILE, serve

    def ready(url: str, names: list[str]) -> None:
        console.print(f"serving {len(names)} deployments against {url}: {', '.join(names)} (Ctrl-C stops)")

    serve(config(), prefect_file or DEFAULT_PREFECT_FILE, on_ready=ready)


# -- queries --------------------------------------------------------------------------------------
def _print_table(table, output: str) -> None:
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
            view.add_row(*["" if v is None else str(v) for v in row.values()])
        console.print(view)
        console.print(f"{table.num_rows} row(s)", style="dim")


@app.command()
def sql(
    query: str = typer.Argument(..., help="SQL to run, e.g. \"SELECT count(*) FROM trace_events\"."),
    db: Optional[Path] = typer.Option(None, "--db", help="DuckDB file (overrides the global --db)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as one JSON array."),
    as_csv: bool = typer.Option(False, "--csv", help="Print the rows as CSV."),
    write: bool = typer.Option(False, "--write", help="Allow statements that change the database."),
    param: list[str] = typer.Option([], "--param", "-p", help="A value for the next ? placeholder."),
) -> None:
    """Run SQL against the database, live: through the materializer while it runs."""
    from rankstream.consumers.query import connect

    database = connect(config(db_path=db).db_path, read_only=not write)
    table = (database.execute if write else database.arrow)(query, param or None)
    _print_table(table, "json" if as_json else "csv" if as_csv else "table")


@app.command()
def status(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Runs, ranks, events, lag, rejects and dropped events."""
    from rankstream.status import collect_status, render_status

    report = collect_status(config())
    if as_json:
        sys.stdout.write(json.dumps(report, default=str) + "\n")
    else:
        render_status(report, console)


@app.command()
def demo(
    ranks: int = typer.Option(4, min=2, help="Ranks (processes) of the gloo job."),
    steps: int = typer.Option(20, min=2, help="Training steps."),
    fault: str = typer.Option("none", help="Inject a fault: none, hang, stall, desync, wrong_op, extra, straggler, crash."),
    fault_rank: int = typer.Option(1, help="The rank that misbehaves."),
    synthetic: bool = typer.Option(False, help="Stream a synthetic job instead (no torch)."),
) -> None:
    """Start what is needed, run a real 4-rank gloo training job streamed by rankstream, show what
    was captured, stop."""
    from rankstream.demo.runner import run_demo
    from rankstream.demo.job import FAULTS

    if fault not in FAULTS:
        raise typer.BadParameter(f"--fault must be one of {', '.join(FAULTS)}")
    if not 0 <= fault_rank < ranks:
        raise typer.BadParameter(f"--fault-rank must be between 0 and {ranks - 1}")
    run_demo(config(), ranks=ranks, steps=steps, fault=fault, fault_rank=fault_rank, synthetic=synthetic,
             console=console)


def main() -> None:
    try:
        code = app(standalone_mode=False)
    except RankstreamError as exc:
        errors.print(f"rankstream: error: {exc}", markup=False, highlight=False, soft_wrap=True)  # one line
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        errors.print("rankstream: interrupted")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:  # usage errors (typer vendors click: these are not click's own classes)
        if not hasattr(exc, "show"):
            raise
        exc.show()
        sys.exit(exc.exit_code)
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
