"""``rankstream demo``: the main job on the embedded defaults, start to finish.

It starts the embedded broker and the materializer if they are not running, launches one process
per rank that streams a synthetic training job, waits until DuckDB holds every event the ranks
report as emitted, prints what was captured and a sample query, and stops what it started.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid

from rich.console import Console
from rich.table import Table

from rankstream.config import Config

__all__ = ["run_demo"]

SAMPLE_SQL = """SELECT rank, count(DISTINCT step) AS steps,
       round(avg(dur_ns) FILTER (WHERE name LIKE 'ProfilerStep#%') / 1e6, 2) AS step_ms,
       round(sum(dur_ns) FILTER (WHERE name LIKE 'gloo:%') / 1e6, 2) AS comm_ms
FROM trace_events WHERE run_id = ? GROUP BY rank ORDER BY rank"""

CAPTURED_SQL = """
SELECT k.rank, k.host, k.pid,
       (SELECT count(*) FROM trace_events t WHERE t.run_id = k.run_id AND t.rank = k.rank) AS events,
       (SELECT count(DISTINCT step) FROM trace_events t WHERE t.run_id = k.run_id AND t.rank = k.rank) AS steps,
       (SELECT count(*) FROM fr_entries f WHERE f.run_id = k.run_id AND f.rank = k.rank) AS collectives,
       (SELECT count(*) FROM process_groups g WHERE g.run_id = k.run_id AND g.rank = k.rank) AS groups
FROM ranks k WHERE k.run_id = ? ORDER BY k.rank"""


def _rank_main(run_id: str, rank: int, world_size: int, steps: int, events_per_step: int, config: Config,
               results) -> None:
    from rankstream.producers import Producer
    from rankstream.synthetic import SyntheticJob, run_synthetic_rank

    producer = Producer(run_id=run_id, rank=rank, world_size=world_size, config=config)
    job = SyntheticJob(run_id, world_size, steps, events_per_step)
    emitted = run_synthetic_rank(job, rank, producer, pace_s=0.02)
    stats = producer.close()
    results.put((rank, emitted, stats.events_sent, stats.events_dropped))


def _wait_for(database, run_id: str, expected: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    stored = 0
    while time.monotonic() < deadline:
        stored = database.fetchall(
            "SELECT coalesce(sum(events), 0) FROM ingested_batches WHERE run_id = ?", [run_id])[0][0]
        if stored >= expected:
            break
        time.sleep(0.2)
    return stored


def run_demo(config: Config, *, ranks: int, steps: int, events_per_step: int, console: Console) -> None:
    from rankstream.consumers.query import connect
    from rankstream.deploy.services import absolute, down, materializer_pid, up

    config = absolute(config)
    started_here = materializer_pid(config) is None
    services = up(config)
    console.print(f"[bold]rankstream demo[/]: broker {config.bootstrap_servers}, "
                  f"materializer pid {services.materializer_pid}, database {config.db_path}")
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    try:
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        workers = [context.Process(target=_rank_main, args=(run_id, r, ranks, steps, events_per_step, config,
                                                            results)) for r in range(ranks)]
        began = time.monotonic()
        for worker in workers:
            worker.start()
        reports = sorted(results.get(timeout=300) for _ in workers)
        for worker in workers:
            worker.join()
        emitted = sum(r[1] for r in reports)
        console.print(f"{ranks} ranks emitted {emitted:,} trace events in {time.monotonic() - began:.1f} s "
                      f"(dropped by producers: {sum(r[3] for r in reports)})")
        database = connect(config.db_path)
        stored = _wait_for(database, run_id, emitted, timeout_s=60)
        console.print(f"materialized: {stored:,} of {emitted:,} events in {config.db_path}")
        _show(database, console, f"run {run_id}: captured per rank", CAPTURED_SQL, run_id)
        console.print("\nsample query (rankstream sql, or rankstream.connect() in Python):")
        console.print(SAMPLE_SQL.replace("?", f"'{run_id}'"), style="cyan", markup=False, highlight=False)
        _show(database, console, None, SAMPLE_SQL, run_id)
        if stored < emitted:
            raise SystemExit(f"demo: only {stored} of {emitted} events reached DuckDB")
    finally:
        if started_here:
            stopped = down(config)
            console.print("stopped: " + ", ".join(stopped))


def _show(database, console: Console, title: str | None, sql: str, run_id: str) -> None:
    result = database.arrow(sql, [run_id])
    table = Table(*result.column_names, title=title)
    for row in result.to_pylist():
        table.add_row(*[str(v) for v in row.values()])
    console.print(table)
