"""``rankstream analyze trace FILE...``: the GPU analyses of trace files, with no broker running.

What a user does with Holistic Trace Analysis in a notebook, as one command: the files are read
into a scratch database (``merge_traces.scratch_run``, the reader ``merge`` uses) and analysed by
the same code as a stored run (``flows.gpu_breakdown``); the tables are returned and the database
goes away. A trace with no GPU events gets the CPU breakdown instead, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rankstream.flows.breakdown import analyze_breakdown
from rankstream.flows.gpu_breakdown import GPU_TABLES, analyze_gpu_breakdown
from rankstream.flows.merge_traces import RUN_ID, scratch_run

__all__ = ["TraceAnalysis", "analyze_trace_files"]

#: How each table's rows are listed: the biggest first where there are many.
_ORDER = {"gpu_kernel_breakdown": "rank, kernel_type, sum_ns DESC, name", "gpu_kernel_type_share": "sum_ns DESC",
          "gpu_idle_time": "rank, stream, idle_category", "gpu_queue_length": "rank, stream",
          "gpu_memory_bandwidth": "rank, name", "gpu_step_communication": "rank, step"}
#: One row per launch is for SQL over a stored run; the one-shot view shows gpu_launch_summary.
_PER_EVENT = {"gpu_kernel_launches"}


@dataclass
class TraceAnalysis:
    files: list[str]
    #: table name -> rows (the GPU tables, or ``cpu_temporal_breakdown`` for a trace without GPU events)
    tables: dict[str, list[dict]] = field(default_factory=dict)
    #: events by category, unknown categories included (nothing is left out silently)
    categories: dict[str, int] = field(default_factory=dict)
    note: str | None = None


def analyze_trace_files(paths: list[Path], *, rank: int | None = None, keep_last_step: bool = False) -> TraceAnalysis:
    """The GPU tables of ``paths`` (one file per rank), HTA's last-step rule applied unless
    ``keep_last_step``. A single file whose rank cannot be told is taken as rank 0, as HTA does."""
    fallback_rank = 0 if rank is None and len(paths) == 1 else None
    with scratch_run(paths, rank=rank, fallback_rank=fallback_rank) as (database, files):
        result = TraceAnalysis(files=[str(f.path) for f in files])
        if any(f.rank_assumed for f in files):
            result.note = "the file does not say its rank: taken as rank 0"
        result.categories = dict(database.fetchall(
            "SELECT coalesce(nullif(cat, ''), '(none)'), count(*) FROM trace_events GROUP BY ALL ORDER BY 2 DESC"))
        steps = analyze_gpu_breakdown(database, RUN_ID, keep_last_step=keep_last_step)
        result.note = "; ".join(filter(None, [result.note, steps])) or None
        tables = [table for table in GPU_TABLES if table not in _PER_EVENT]
        if not database.fetchall("SELECT count(*) FROM gpu_temporal_breakdown")[0][0]:
            result.note = "; ".join(filter(None, [result.note, "no GPU events (no event has a stream): CPU figures only"]))
            analyze_breakdown(database, RUN_ID)
            tables = ["cpu_temporal_breakdown"]
        for table in tables:
            order = _ORDER.get(table, "ALL")
            result.tables[table] = database.arrow(f"SELECT * EXCLUDE (run_id) FROM {table} ORDER BY {order}").to_pylist()
        return result
