"""``rankstream report --run RUN``: the run's analyses as text (or one JSON object).

Reads the result tables the analyses wrote (``flows.pipeline.analyze_everything`` refreshes them
first unless asked not to) and prints, in the order someone chasing a problem reads them: the
verdict and its root cause, the collective findings, step-time distributions (percentiles and the
worst steps, so one long stall is not averaged away) and phases, who is slow, communication, the
CPU compute / communication / idle breakdown, on GPU runs HTA's GPU figures (breakdown, idle time
per stream, launches, memory bandwidth), the top ops, and last the clock alignment. Times are in
ms throughout, lines at most 120 columns, and a legend names the derived columns.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rankstream.consumers.query import connect

__all__ = ["gather_report", "render_run_report", "render_comparison"]

_SECTIONS = {
    "findings": """
        SELECT position, kind, pg_name AS "group", seq, culprit_ranks, detail
        FROM findings WHERE run_id = $1 ORDER BY position LIMIT 20""",
    "steps": """
        SELECT rank, count(*) AS steps, quantile_cont(duration_ns, 0.5) / 1e6 AS p50_ms,
               quantile_cont(duration_ns, 0.9) / 1e6 AS p90_ms, quantile_cont(duration_ns, 0.99) / 1e6 AS p99_ms,
               max(duration_ns) / 1e6 AS max_ms,
               array_to_string(list(step ORDER BY duration_ns DESC)[1:3], ', ') AS worst_steps
        FROM step_trace WHERE run_id = $1 GROUP BY rank ORDER BY rank""",
    "phases": """
        SELECT rank, avg(busy_ns) / 1e6 AS busy_ms, avg(data_ns) / 1e6 AS data_ms,
               avg(forward_ns) / 1e6 AS forward_ms, avg(backward_ns) / 1e6 AS backward_ms,
               avg(optimizer_ns) / 1e6 AS optimizer_ms, avg(communication_ns) / 1e6 AS comm_ms,
               avg(other_ns) / 1e6 AS other_ms, avg(iteration_interval_ns) / 1e6 AS interval_ms
        FROM step_trace WHERE run_id = $1 GROUP BY rank ORDER BY rank""",
    "slowest": """
        SELECT ranking, rank, steps, mean_step_ns / 1e6 AS step_ms, mean_busy_ns / 1e6 AS busy_ms,
               busy_vs_median, times_slowest
        FROM rank_slowness WHERE run_id = $1 ORDER BY ranking""",
    "noise": """
        SELECT rank, avg(busy_ns) / 1e6 AS busy_ms, stddev_samp(busy_ns) / sqrt(count(*)) / 1e6 AS busy_error_ms
        FROM step_trace WHERE run_id = $1 GROUP BY rank""",
    "communication": """
        SELECT concat_ws(' ', pg_name, pg_desc) AS "group", op, calls, total_ns / 1e6 AS total_ms,
               mean_ns / 1e6 AS mean_ms, mean_bytes, bandwidth_gb_s AS gb_s, wait_ns / 1e6 AS wait_ms,
               transfer_ns / 1e6 AS transfer_ms, time_source
        FROM comm_summary WHERE run_id = $1 ORDER BY total_ns DESC NULLS LAST, total_bytes DESC""",
    "matrix": """
        SELECT kind, src_rank, dst_rank, ops, bytes, time_ns / 1e6 AS time_ms, bandwidth_gb_s AS gb_s
        FROM comm_matrix WHERE run_id = $1 ORDER BY bytes DESC LIMIT 16""",
    "breakdown": """
        SELECT rank, span_ns / 1e6 AS span_ms, cpu_compute_pct AS compute_pct, cpu_communication_pct AS comm_pct,
               cpu_idle_pct AS idle_pct, cpu_overlap_pct_of_comm AS hidden_pct
        FROM cpu_temporal_breakdown WHERE run_id = $1 ORDER BY rank""",
    "gpu_breakdown": """
        SELECT t.rank, t.kernel_time / 1e6 AS gpu_span_ms, t.idle_time_pctg AS idle_pct,
               t.compute_time_pctg AS compute_pct, t.non_compute_time_pctg AS non_compute_pct,
               o.comp_comm_overlap_pctg AS hidden_pct, s.exposed_comm_ms_per_step
        FROM gpu_temporal_breakdown t LEFT JOIN comm_comp_overlap o USING (run_id, rank)
        LEFT JOIN (SELECT run_id, rank, avg(exposed_communication_ns) / 1e6 AS exposed_comm_ms_per_step
                   FROM gpu_step_communication GROUP BY ALL) s USING (run_id, rank)
        WHERE t.run_id = $1 ORDER BY t.rank""",
    "gpu_streams": """
        SELECT rank, stream,
               sum(idle_time) FILTER (WHERE idle_category = 'host_wait') / 1e6 AS host_wait_ms,
               sum(idle_time) FILTER (WHERE idle_category = 'kernel_wait') / 1e6 AS kernel_wait_ms,
               sum(idle_time) FILTER (WHERE idle_category = 'other') / 1e6 AS other_idle_ms,
               any_value(q.mean) AS mean_queue, any_value(q.max) AS max_queue
        FROM gpu_idle_time i LEFT JOIN gpu_queue_length q USING (run_id, rank, stream)
        WHERE run_id = $1 GROUP BY rank, stream ORDER BY rank, stream""",
    "gpu_launches": """
        SELECT rank, launches, long_launch_calls, long_launch_delays, short_kernels,
               cpu_duration_p50 / 1e6 AS call_p50_ms, launch_delay_p50 / 1e6 AS delay_p50_ms,
               launch_delay_p99 / 1e6 AS delay_p99_ms, launch_delay_max / 1e6 AS delay_max_ms
        FROM gpu_launch_summary WHERE run_id = $1 ORDER BY rank""",
    "gpu_memory": """
        SELECT rank, name, count AS points, mean AS mean_gb_s, p50 AS p50_gb_s, max AS max_gb_s
        FROM gpu_memory_bandwidth WHERE run_id = $1 ORDER BY rank, name""",
    "top_ops": """
        SELECT position, name, ranks, calls, total_ns / 1e6 AS total_ms, mean_rank_ns / 1e6 AS per_rank_ms,
               max_rank, spread
        FROM op_stats WHERE run_id = $1 ORDER BY position LIMIT 12""",
    "clock": """
        SELECT rank, source, offset_ns / 1e6 AS offset_ms, error_ns / 1e6 AS error_ms, samples, chosen, detail
        FROM clock_offsets WHERE run_id = $1 ORDER BY rank, NOT chosen, source""",
}

_TITLES = {
    "findings": "Collective findings (the first is the root cause)",
    "steps": "Step time per rank (ms): distribution and worst steps",
    "phases": "Step phases per rank (means, ms)",
    "slowest": "Slowest ranks",
    "communication": "Communication per group and op",
    "matrix": "Communication matrix (top pairs by bytes)",
    "breakdown": "CPU time breakdown per rank (% of traced span)",
    "gpu_breakdown": "GPU time breakdown per rank (% of the GPU span, HTA's rules)",
    "gpu_streams": "GPU idle time per stream (host wait: the CPU launched late) and launch queue",
    "gpu_launches": "Kernel launches per rank (long call > 0.05 ms, long delay > 0.1 ms)",
    "gpu_memory": "Memory bandwidth per kind (GB/s at change points)",
    "top_ops": "Top ops (all ranks) and their spread across ranks",
    "clock": "Clock offsets (rank clock - reference clock, ms; chosen source first)",
}

#: What the derived column names mean, printed under the report.
LEGEND = (
    "legend: p50/p90/p99/max_ms = step-time percentiles; worst_steps = the rank's slowest steps; "
    "busy = step time not spent communicating; busy_vs_median = busy time / the median rank's; "
    "times_slowest = steps in which the rank was slowest; hidden_pct = communication time overlapped by "
    "compute; spread = the slowest rank's time in the op / the median rank's; gb_s = GB per second."
)
#: A slowest rank is named only when its busy time exceeds the median rank's by this share...
SLOWEST_MARGIN = 0.05
#: ... and by this many standard errors of its own mean (step-to-step noise).
SLOWEST_ERRORS = 3.0
#: At most this many columns: the report is read in terminals and pasted into tickets.
WIDTH = 120


#: The analysis behind a section whose rows may rightly be none (no findings is a result, not a gap).
_ANALYSIS_OF = {"findings": "collectives"}
#: Sections that only GPU runs have: left out of a CPU run's report, with one line saying why.
_GPU_ONLY = ("gpu_breakdown", "gpu_streams", "gpu_launches", "gpu_memory")


def gather_report(db_path: Path, run_id: str) -> dict[str, list[dict]]:
    """Every section's rows, by section name, plus ``analyses``: which analyses ran for the run."""
    database = connect(db_path)
    report = {name: database.arrow(sql, [run_id]).to_pylist() for name, sql in _SECTIONS.items()}
    report["processes"] = database.arrow(
        "SELECT rank, count(DISTINCT session_id) AS processes FROM rank_metadata WHERE run_id = $1 GROUP BY rank "
        "HAVING count(DISTINCT session_id) > 1 ORDER BY rank", [run_id]).to_pylist()
    report["analyses"] = database.arrow(
        "SELECT analysis, max(finished_ns) AS finished_ns, arg_max(detail, finished_ns) AS detail FROM analyses_done "
        "WHERE run_id = $1 GROUP BY analysis ORDER BY analysis", [run_id]).to_pylist()
    return report


def _cell(value) -> Text:
    """A value as a table cell: text, never markup (kernel names and errors hold brackets)."""
    if value is None:
        return Text("")
    if isinstance(value, float):
        return Text(f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}")
    if isinstance(value, list):
        return Text(", ".join(map(str, value)))
    if isinstance(value, int) and not isinstance(value, bool):
        return Text(f"{value:,}" if abs(value) >= 10_000 else str(value))
    return Text(str(value))


def _table(title: str, rows: list[dict]) -> Table:
    view = Table(*rows[0].keys(), title=title, title_justify="left", show_lines=False)
    for row in rows:
        view.add_row(*[_cell(v) for v in row.values()])
    return view


def render_run_report(run_id: str, report: dict[str, list[dict]], console: Console) -> None:
    """The verdict first, then the sections in ``_TITLES``' order, at most ``WIDTH`` columns."""
    console.width = min(console.width, WIDTH)
    console.print(Text(f"run {run_id}", style="bold"))
    analyzed = {row["analysis"]: row["detail"] for row in report.get("analyses", [])}
    verdict = analyzed.get("collectives")
    findings = report.get("findings") or []
    if verdict is None:
        console.print("verdict: no collective diagnosis (no Flight Recorder data, or not analyzed)")
    else:
        console.print(Text.assemble((f"verdict: {verdict.upper()}", "bold"),
                                    f": root cause: {findings[0]['detail']}" if findings else ": no problem found"),
                      highlight=False)
    if report.get("processes"):
        ranks = ", ".join(str(row["rank"]) for row in report["processes"])
        console.print(f"[yellow]warning[/]: rank(s) {ranks} were sent by more than one process: two launches under "
                      "one run id (or a restart) are mixed in these figures")
    headline = slowest_headline(report, verdict)
    if headline:
        console.print(headline)
    has_gpu = any(report.get(name) for name in _GPU_ONLY)
    for name, title in _TITLES.items():
        if name not in report or (name in _GPU_ONLY and not has_gpu):
            continue  # a caller may ask for some sections only
        rows = report[name]
        if rows:
            console.print(_table(title, rows))
        elif _ANALYSIS_OF.get(name) in analyzed:
            verdict_of = analyzed[_ANALYSIS_OF[name]]
            console.print(f"{title}: none" + (f" (verdict: {verdict_of})" if verdict_of else ""))
        else:
            console.print(f"{title}: [dim]no data[/]")
    if not has_gpu and "breakdown" in report:
        console.print("GPU analyses: no GPU events in this run (the breakdown above is of CPU ops)")
    console.print(LEGEND, style="dim")


def slowest_headline(report: dict[str, list[dict]], verdict: str | None) -> str | None:
    """"slowest rank: R ..." when one rank is slower than the others beyond their noise, and no
    fault explains the run better (a hung or desynced run's slowest rank is a victim, not news)."""
    slowest = report.get("slowest") or []
    if len(slowest) < 2 or verdict not in (None, "healthy", "straggler"):
        return None
    top = slowest[0]
    noise = {row["rank"]: row for row in report.get("noise") or []}
    busy = sorted(row["busy_ms"] for row in noise.values() if row["busy_ms"] is not None)
    mine = noise.get(top["rank"])
    if not busy or mine is None or mine["busy_ms"] is None:
        return None
    median = busy[len(busy) // 2]
    beyond = max(SLOWEST_MARGIN * median, SLOWEST_ERRORS * (mine["busy_error_ms"] or 0.0))
    if mine["busy_ms"] - median <= beyond:
        return None
    return (f"slowest rank: {top['rank']} ({top['busy_vs_median']:.2f}x the median rank's busy time, "
            f"slowest in {top['times_slowest']} of {top['steps']} steps)")


def render_comparison(run_a: str, run_b: str, rows: list[dict], *, console: Console) -> None:
    if rows:
        console.print(_table(f"{run_a} -> {run_b}", rows))
    else:
        console.print(f"{run_a} -> {run_b}: nothing to compare (analyze both runs first)")
