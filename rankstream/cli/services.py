"""Commands that start and stop things: ``up``, ``down``, ``consume``, ``broker``, ``serve``, ``status``."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Optional

import typer

from rankstream.cli.app import app, broker_app, config, console, errors, server_module


@broker_app.command("start", epilog="Example: rankstream broker start --broker-port 29100")
def broker_start() -> None:
    """Start the embedded broker and wait until it answers."""
    state = server_module("services").start_embedded_broker(config())
    console.print(f"broker up: {state.bootstrap} (pid {state.pid}, log {state.log})")


@broker_app.command("stop", epilog="Example: rankstream broker stop")
def broker_stop() -> None:
    """Stop the embedded broker (its topics are lost: it keeps them in memory)."""
    stopped = server_module("deploy.broker").stop_broker(config())
    console.print("broker stopped" if stopped else "no embedded broker was running")


@broker_app.command("status", epilog="Example: rankstream broker status")
def broker_status_command() -> None:
    """Say whether the embedded broker runs, and where."""
    state = server_module("deploy.broker").broker_status(config())
    if state is None:
        console.print("embedded broker: not running")
        raise typer.Exit(1)
    console.print(f"embedded broker: running at {state.bootstrap} (pid {state.pid})")


@app.command(epilog="Example: rankstream up --db runs.duckdb; for other nodes: rankstream up --bind 0.0.0.0 "
                     "--advertise node0.cluster")
def up(
    bind: Optional[str] = typer.Option(None, "--bind", help="Address the embedded broker listens on "
                                                            "(default 127.0.0.1: this machine only)."),
    advertise: Optional[str] = typer.Option(None, "--advertise", help="Host name other nodes reach it by "
                                                                      "(default: the bound address, or this host)."),
) -> None:
    """Start the embedded broker (unless a cluster is configured) and a background materializer;
    then deliver what jobs left in the spool while nothing was up."""
    cfg = config(broker_bind=bind, broker_advertise=advertise)
    if cfg.uses_embedded_broker and not cfg.broker_is_private:
        errors.print(f"rankstream: warning: the broker listens on {cfg.broker_bind}:{cfg.broker_port}: anyone who "
                     "reaches that port can write events into any run. Across untrusted networks use a Kafka "
                     "cluster with SASL_SSL (docs/multinode.md).", markup=False, soft_wrap=True)
    services = server_module("services").up(cfg)
    where = services.broker.bootstrap if services.broker else cfg.bootstrap_servers
    console.print(f"up: broker {where}, materializer pid {services.materializer_pid} -> {cfg.db_path}")
    if cfg.uses_embedded_broker and not cfg.broker_is_private:
        console.print(f"other nodes: eval $(rankstream env) there, or RANKSTREAM_KAFKA_BOOTSTRAP_SERVERS="
                      f"{cfg.broker_advertised}", markup=False, soft_wrap=True)
    _deliver_spools(cfg)


@app.command(epilog="Example: rankstream flush")
def flush() -> None:
    """Deliver the events producers left in this state dir's spool (their job ended with no broker)."""
    if not _deliver_spools(config()):
        console.print("nothing spooled")


def _deliver_spools(cfg) -> bool:
    delivery = server_module("spools").deliver_spools(cfg)
    if delivery is not None:
        console.print(delivery.line(), markup=False, highlight=False, soft_wrap=True)
    return delivery is not None


@app.command(epilog="Example: rankstream down")
def down() -> None:
    """Stop what `rankstream up` started."""
    stopped = server_module("services").down(config())
    console.print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@app.command(epilog="Example: rankstream consume --once")
def consume(
    once: bool = typer.Option(False, "--once", help="Stop when the offsets seen at start are reached."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Empty every table and replay all partitions from 0."),
    no_sql: bool = typer.Option(False, "--no-serve-sql", help="Do not serve SQL to other processes."),
    max_messages: int = typer.Option(500, "--max-messages", min=1, help="Messages per poll (per transaction)."),
) -> None:
    """Materialize the topics into DuckDB in the foreground (Ctrl-C stops cleanly)."""
    services = server_module("services")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    cfg = config()
    errors.print(f"rankstream consume: {cfg.bootstrap_servers} -> {cfg.db_path}")
    status = services.materialize(cfg, stop, once=once, rebuild=rebuild, query_server=not no_sql,
                                  max_messages=max_messages, log=_log_line)
    errors.print(f"consumed {status.messages} messages, {status.events} events, "
                 f"{status.rejected} rejected, {status.duplicates} duplicates skipped")


def _log_line(line: str) -> None:
    """Service log lines: plain, unwrapped, one per event, for log files and terminals alike."""
    print(line, file=sys.stderr, flush=True)


@app.command(epilog="Example: rankstream status --json")
def status(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Runs, ranks, events, lag, rejects, dropped events and the live findings."""
    module = server_module("status")
    report = module.collect_status(config())
    if as_json:
        sys.stdout.write(json.dumps(report, default=str) + "\n")
    else:
        module.render_status(report, console)


@app.command("serve", epilog="Example: PREFECT_API_URL=http://host:4200/api rankstream serve")
def serve_command(
    prefect_file: Optional[Path] = typer.Option(None, "--prefect-file", help="Deployments and schedules "
                                                "(default: rankstream's deploy/prefect.yaml)."),
) -> None:
    """Run the analysis flows on their schedules (starts a local Prefect server unless
    PREFECT_API_URL is set; stops it on exit)."""
    schedules = server_module("schedules")

    def ready(url: str, names: list[str]) -> None:
        console.print(f"serving {len(names)} deployments against {url}: {', '.join(names)} (Ctrl-C stops)")

    schedules.serve(config(), prefect_file or schedules.DEFAULT_PREFECT_FILE, on_ready=ready)
