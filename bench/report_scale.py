"""``rankstream report --html`` at scale: write time, file size and Chromium's load-and-draw time for
a run of 1024 ranks x 10,000 steps (issue 27's targets: <= 5 s, <= 20 MB, <= 5 s).

    python bench/report_scale.py [--ranks 1024] [--steps 10000] [--collectives 2000] [--rounds 3]

The run is synthetic rows written straight into DuckDB with SQL (step times, Flight Recorder entries
of one group, a ring's communication matrix, clocks, heartbeats, a CPU breakdown, top ops), one
step stalled for 40 s. The browser is Debian's chromium, driven by playwright; "drawn" is the page
saying that every plotly figure resolved.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from rankstream.flows.html_report import write_html_report
from rankstream.schemas.tables import ddl

MS = "1000000::BIGINT"  # SQL text: every product in BIGINT


def fill(database, run_id: str, *, ranks: int, steps: int, collectives: int = 1000,
         stalled: tuple[int, int, int] | None = None) -> None:
    """A finished, healthy-looking run of ``ranks`` x ``steps``; ``stalled`` = (rank, step, ns) makes
    that one step last ``ns``."""
    database.execute(ddl())
    stall_rank, stall_step, stall_ns = stalled or (-1, -1, 0)
    database.execute(f"""
        INSERT INTO rank_metadata (run_id, rank, world_size, session_id, sent_ns, host, pid, started_at_ns)
        SELECT '{run_id}', r, {ranks}, 's' || r, 0, 'node' || (r // 8), 1000 + r, 1 FROM range({ranks}) t(r)""")
    database.execute(f"""
        INSERT INTO step_trace (run_id, rank, step, start_ns, end_ns, duration_ns, busy_ns)
        SELECT '{run_id}', r, s, s * 60 * {MS}, s * 60 * {MS} + d, d, d * 0.8
        FROM (SELECT r, s, CASE WHEN r = {stall_rank} AND s = {stall_step} THEN {stall_ns}
                                ELSE 50 * {MS} + (hash(r * 100003 + s) % (5 * {MS}))::BIGINT END AS d
              FROM range({ranks}) a(r), range({steps}) b(s))""")
    database.execute(f"""
        INSERT INTO fr_entries (run_id, rank, snapshot_ns, record_id, pg_id, pg_name, pg_desc, collective_seq_id,
                                p2p_seq_id, profiling_name, time_created_ns, state, is_p2p)
        SELECT '{run_id}', r, 1, c, 0, '0', 'default_pg', c + 1, 0, 'nccl:all_reduce', c * 30 * {MS},
               'completed', false
        FROM range({ranks}) a(r), range({collectives}) b(c)""")
    database.execute(f"""
        INSERT INTO comm_matrix SELECT '{run_id}', 'collective', r, (r + 1) % {ranks}, {collectives},
                                       {collectives}::BIGINT * 4194304, {collectives} * 3 * {MS}, 1.4
        FROM range({ranks}) t(r)""")
    database.execute(f"""
        INSERT INTO clock_offsets (run_id, rank, reference_rank, source, offset_ns, error_ns, samples, chosen)
        SELECT '{run_id}', r, 0, 'store', (hash(r) % 200000)::BIGINT - 100000, 20000, 8, true FROM range({ranks}) t(r)""")
    database.execute(f"""
        INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, events_emitted, events_sent, events_spooled,
                                events_dropped, final)
        SELECT '{run_id}', r, 's' || r, 2, {steps} * 40, {steps} * 40, 0, 0, true FROM range({ranks}) t(r)""")
    database.execute(f"""
        INSERT INTO cpu_temporal_breakdown (run_id, rank, span_ns, cpu_compute_pct, cpu_communication_pct,
                                            cpu_idle_pct, cpu_overlap_pct_of_comm)
        SELECT '{run_id}', r, {steps} * 60 * {MS}, 70 + hash(r) % 10, 20, 10 - hash(r) % 10, 30 FROM range({ranks}) t(r)""")
    database.execute(f"""
        INSERT INTO op_stats (run_id, name, ranks, calls, total_ns, position)
        SELECT '{run_id}', 'aten::op_' || i, {ranks}, {steps} * {ranks}, (40 - i) * {steps} * {ranks} * 10000, i
        FROM range(40) t(i)""")
    database.execute(f"INSERT INTO analyses_done VALUES ('{run_id}', 'collectives', 1, 'healthy')")


def load_seconds(page_path: Path, chromium: str) -> float:
    """From navigation to every plot drawn, in a fresh headless Chromium page."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        started = time.perf_counter()
        page.goto(page_path.as_uri())
        page.wait_for_selector("body[data-drawn]", timeout=120_000)
        seconds = time.perf_counter() - started
        browser.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--collectives", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with tempfile.TemporaryDirectory(prefix="report-scale-") as scratch:
        db_path = Path(scratch) / "scale.duckdb"
        started = time.perf_counter()
        with duckdb.connect(str(db_path)) as database:
            fill(database, "scale", ranks=args.ranks, steps=args.steps, collectives=args.collectives,
                 stalled=(args.ranks // 2, args.steps // 3, 40_000_000_000))
        print(f"{args.ranks} ranks x {args.steps:,} steps, {args.collectives:,} collectives per rank: "
              f"rows written in {time.perf_counter() - started:.1f} s", flush=True)
        writes, loads, size = [], [], 0
        for _ in range(args.rounds):
            written = write_html_report(db_path, "scale", Path(scratch) / "scale.html")
            writes.append(written.seconds)
            size = written.bytes
            if chromium:
                loads.append(load_seconds(written.path, chromium))
        write_s, load_s = statistics.median(writes), statistics.median(loads) if loads else None
        print(f"{'write (median of %d)' % args.rounds:28s} {write_s:6.2f} s   target <= 5 s: "
              f"{'met' if write_s <= 5 else 'MISSED'}")
        print(f"{'file size':28s} {size / 2**20:6.2f} MB  target <= 20 MB: {'met' if size <= 20 << 20 else 'MISSED'}")
        if load_s is None:
            print("browser load: no chromium on this machine (apt-get install chromium)")
        else:
            print(f"{'Chromium load and draw':28s} {load_s:6.2f} s   target <= 5 s: {'met' if load_s <= 5 else 'MISSED'}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
