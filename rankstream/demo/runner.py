"""``rankstream demo``: the main job on the embedded defaults, start to finish.

It starts the embedded broker and the materializer if they are not running, launches a real gloo
training job with one process per rank (``rankstream.demo.job``; ``--synthetic`` streams a
synthetic job without torch instead), and shows, from DuckDB while the job runs, each rank's step
and any live finding. The ranks' own output (torch's and Kineto's chatter) goes to a log file.
Then it waits until DuckDB has caught up, prints what was captured per rank, a sample query, the
analyses and the diagnosis, and stops what it started.
"""

from __future__ import annotations

import multiprocessing
import socket
import tempfile
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rankstream.consumers.query import connect
from rankstream.demo.job import JobSpec, read_reports, start_job
from rankstream.demo.synthetic import SyntheticJob, run_synthetic_rank
from rankstream.flows.pipeline import analyze_everything
from rankstream.flows.html_report import html_report_if_possible
from rankstream.flows.report import gather_report, render_run_report
from rankstream.flows.timeline import write_timeline
from rankstream.producers.producer import Producer
from rankstream.schemas.config import Config
from rankstream.schemas.settings import config_env
from rankstream.schemas.settings import absolute_paths
from rankstream.services import down, materializer_pid, up
from rankstream.status import live_finding_line, live_findings

__all__ = ["run_demo"]

SAMPLE_SQL = """SELECT rank,
       count(*) FILTER (WHERE name = 'step') AS steps,
       round(median(dur_ns) FILTER (WHERE name LIKE 'ProfilerStep#%') / 1e6, 2) AS profiled_step_ms,
       count(*) FILTER (WHERE ph = 'B' AND name = 'allreduce') AS allreduce_spans
FROM trace_events WHERE run_id = ? GROUP BY rank ORDER BY rank"""

CAPTURED_SQL = """
SELECT k.rank, k.host, k.pid,
       (SELECT count(*) FROM trace_events t WHERE t.run_id = k.run_id AND t.rank = k.rank) AS events,
       (SELECT count(DISTINCT step) FROM trace_events t WHERE t.run_id = k.run_id AND t.rank = k.rank) AS steps,
       (SELECT count(DISTINCT record_id) FROM fr_entries f WHERE f.run_id = k.run_id AND f.rank = k.rank)
           AS collectives,
       (SELECT max(collective_seq_id) FROM fr_entries f WHERE f.run_id = k.run_id AND f.rank = k.rank
            AND pg_desc = 'default_pg') AS last_seq_default_pg,
       (SELECT count(*) FROM process_groups g WHERE g.run_id = k.run_id AND g.rank = k.rank) AS groups
FROM ranks k WHERE k.run_id = ? ORDER BY k.rank"""


#: Each rank's latest step marker that DuckDB holds.
_PROGRESS_SQL = """SELECT rank, max(step) FROM trace_events WHERE run_id = ? AND name = 'step' AND step IS NOT NULL
GROUP BY rank ORDER BY rank"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _synthetic_rank(run_id: str, rank: int, world_size: int, steps: int, config: Config) -> None:
    producer = Producer(run_id=run_id, rank=rank, world_size=world_size, config=config)
    run_synthetic_rank(SyntheticJob(run_id, world_size, steps, 2000), rank, producer, pace_s=0.02)
    producer.close()


def _launch(config: Config, *, run_id: str, ranks: int, steps: int, fault: str, fault_rank: int,
            synthetic: bool, report_dir: str, log_path: Path, while_running) -> list[int]:
    """Run one process per rank and wait for all of them, calling ``while_running()`` about twice a
    second meanwhile; returns their exit codes."""
    if synthetic:
        context = multiprocessing.get_context("spawn")
        workers = [context.Process(target=_synthetic_rank, args=(run_id, r, ranks, steps, config))
                   for r in range(ranks)]
        for worker in workers:
            worker.start()
    else:
        spec = JobSpec(run_id=run_id, world_size=ranks, steps=steps, fault=fault, fault_rank=fault_rank,
                       master_port=_free_port(), report_dir=report_dir, log_path=str(log_path))
        workers = start_job(spec, config_env(config))
    deadline = time.monotonic() + 600
    while any(worker.is_alive() for worker in workers) and time.monotonic() < deadline:
        while_running()
        time.sleep(0.5)
    for worker in workers:
        worker.join(timeout=max(0.0, deadline - time.monotonic()))
    return [worker.exitcode for worker in workers]


class _LiveView:
    """While the job runs: each rank's latest stored step (a line when it moved, at most every
    two seconds) and each live finding of the materializer's hang watch, once."""

    def __init__(self, database, run_id: str, steps: int, console: Console) -> None:
        self._database, self._run_id, self._steps, self._console = database, run_id, steps, console
        self._seen: set[tuple] = set()
        self._progress: list = []
        self._printed_at = 0.0
        self.misses = 0

    def __call__(self) -> None:
        try:
            progress = self._database.fetchall(_PROGRESS_SQL, [self._run_id])
            findings = live_findings(self._database, self._run_id)
        except Exception:  # the materializer is busy or restarting: counted, and the next call tries again
            self.misses += 1
            return
        if progress and progress != self._progress and time.monotonic() - self._printed_at >= 2.0:
            self._progress, self._printed_at = progress, time.monotonic()
            self._console.print("  step  " + "  ".join(f"rank {rank}: {step + 1}/{self._steps}"
                                                      for rank, step in progress))
        for finding in findings:
            key = (finding["kind"], finding["pg_name"], finding["seq"], tuple(finding["culprit_ranks"]))
            if key not in self._seen:
                self._seen.add(key)
                self._console.print("live, while the job runs: " + live_finding_line(finding))


def _wait_caught_up(database, run_id: str, timeout_s: float = 60.0) -> int:
    """Wait until the stored event count stops growing (the ranks are gone; the bus is drained)."""
    deadline = time.monotonic() + timeout_s
    last, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        stored = database.fetchall("SELECT coalesce(sum(events), 0)::BIGINT FROM ingested_batches "
                                   "WHERE run_id = ?", [run_id])[0][0]
        if stored != last:
            last, stable_since = stored, time.monotonic()
        elif time.monotonic() - stable_since > 1.5:
            break
        time.sleep(0.2)
    return last


def run_demo(config: Config, *, ranks: int, steps: int, console: Console, fault: str = "none",
             fault_rank: int = 1, synthetic: bool = False) -> dict:
    config = absolute_paths(config)
    started_here = materializer_pid(config) is None
    services = up(config)
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    console.print(f"[bold]rankstream demo[/]: run {run_id}, {ranks} ranks x {steps} steps, fault {fault}"
                  + (f" on rank {fault_rank}" if fault != "none" else "")
                  + f"; broker {config.bootstrap_servers}, materializer pid {services.materializer_pid}, "
                    f"database {config.db_path}")
    report_dir = tempfile.mkdtemp(prefix="rankstream-demo-")
    log_path = Path(config.state_dir) / "logs" / f"{run_id}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    console.print(f"the ranks' own output (torch, gloo, Kineto) goes to {log_path}")
    try:
        began = time.monotonic()
        database = connect(config.db_path)
        codes = _launch(config, run_id=run_id, ranks=ranks, steps=steps, fault=fault, fault_rank=fault_rank,
                        synthetic=synthetic, report_dir=report_dir, log_path=log_path,
                        while_running=_LiveView(database, run_id, steps, console))
        reports = read_reports(report_dir)
        console.print(f"job finished in {time.monotonic() - began:.1f} s; exit codes "
                      + ", ".join(f"rank {r}: {c}" for r, c in enumerate(codes)))
        for rank, report in sorted(reports.items()):
            if "error" in report:
                console.print(f"  rank {rank} stopped: {report['error']}", markup=False, highlight=False)
        stored = _wait_caught_up(database, run_id)
        console.print(f"materialized {stored:,} trace events in {config.db_path}")
        for rank, report in sorted(reports.items()):
            if "emitted_1s_before_kill" in report:
                kept = database.fetchall("SELECT count(*) FROM trace_events WHERE run_id = ? AND rank = ?",
                                         [run_id, rank])[0][0]
                verdict = "all survived" if kept >= report["emitted_1s_before_kill"] else "SOME WERE LOST"
                console.print(f"  rank {rank} was killed with SIGKILL: it had emitted "
                              f"{report['emitted_1s_before_kill']:,} events 1 s before the kill; DuckDB holds "
                              f"{kept:,} of its events ({verdict})")
        _show(database, console, f"run {run_id}: captured per rank", CAPTURED_SQL, run_id)
        console.print("\nsample query (rankstream sql, or rankstream.connect() in Python):")
        console.print(SAMPLE_SQL.replace("?", f"'{run_id}'"), style="cyan", markup=False, highlight=False)
        _show(database, console, None, SAMPLE_SQL, run_id)
        timeline = _analyze(config, run_id, console)
        return {"run_id": run_id, "timeline": timeline, "exit_codes": codes, "reports": reports, "stored": stored}
    finally:
        if started_here:
            console.print("stopped: " + ", ".join(down(config)))


def _analyze(config: Config, run_id: str, console: Console) -> str:
    """The run's analyses (through the live materializer), two report sections and a timeline."""
    seconds = analyze_everything(config.db_path, run_id)
    console.print(f"\nanalyses ({', '.join(f'{k} {v:.2f} s' for k, v in seconds.items())}):")
    report = gather_report(config.db_path, run_id)
    render_run_report(run_id, {k: report[k] for k in ("slowest", "findings", "analyses")}, console)
    path = Path(config.state_dir) / "timelines" / f"{run_id}.json.gz"
    write_timeline(config.db_path, run_id, path)
    page = html_report_if_possible(config.db_path, run_id, Path(config.state_dir) / "reports" / f"{run_id}.html")
    console.print(f"timeline for chrome://tracing or ui.perfetto.dev: {path}\n"
                  f"report page: {page}\nfull text report: rankstream report --run {run_id}")
    return str(path)


def _show(database, console: Console, title: str | None, sql: str, run_id: str) -> None:
    result = database.arrow(sql, [run_id])
    table = Table(*result.column_names, title=title)
    for row in result.to_pylist():
        table.add_row(*["" if v is None else str(v) for v in row.values()])
    console.print(table)
