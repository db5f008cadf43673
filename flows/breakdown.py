"""Where each rank's time goes (HTA's core breakdowns), and how two runs differ.

``analyze_breakdown`` fills, for a run:

* ``temporal_breakdown``: per rank, over the rank's traced span, the time spent computing (torch
  ops and device kernels), communicating (collective ops and spans, FR collectives), both at
  once (overlap), and neither (idle). Times are unions of intervals, so nested ops count once;
  the unions come from one sort of all intervals per rank (how far earlier intervals reach: a new
  interval adds only what sticks out), plus a small sort of the communication intervals.
* ``op_stats``: per op name, total time on each rank and its spread across ranks; the op a rank
  spends much longer in than its peers is where to look.

``compare_runs`` is HTA's trace diff in SQL: step time and per-step op time of two analyzed runs.
"""

from __future__ import annotations

from pathlib import Path

from rankstream.consumers.query import connect
from rankstream.flows.run_tables import replace_run_rows

__all__ = ["analyze_breakdown", "compare_runs", "TEMPORAL_SQL", "OP_STATS_SQL", "WORK_CATEGORIES"]

#: Trace categories that are work (as opposed to annotations wrapping work, or markers).
WORK_CATEGORIES = ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "mtia_ccp_events")

_WORK = ", ".join(f"'{c}'" for c in WORK_CATEGORIES)

TEMPORAL_SQL = f"""
INSERT INTO temporal_breakdown
WITH names AS MATERIALIZED (
    SELECT name, coalesce(event_phase(name) = 'communication', false) AS is_comm
    FROM (SELECT DISTINCT name FROM trace_events WHERE run_id = $run)
), work AS (
    SELECT i.rank, n.is_comm, i.start_ns, i.end_ns
    FROM run_intervals($run) i JOIN names n USING (name)
    WHERE i.cat IN ({_WORK}) OR n.is_comm
    UNION ALL
    SELECT rank, true, start_ns, end_ns FROM run_fr_calls($run) WHERE end_ns > start_ns
), reach AS (  -- the one sort of every interval: how far the earlier ones (all, and compute only) reach
    SELECT is_comm, rank, start_ns, end_ns, max(end_ns) OVER w AS covered_all,
           max(end_ns) FILTER (WHERE NOT is_comm) OVER w AS covered_compute
    FROM work WINDOW w AS (PARTITION BY rank ORDER BY start_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
), comm_reach AS (  -- communication intervals are few: their own small sort
    SELECT rank, start_ns, end_ns, max(end_ns) OVER (PARTITION BY rank ORDER BY start_ns
                                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered
    FROM work WHERE is_comm
), totals AS (  -- a union's length: the part of each interval the earlier ones do not cover
    SELECT rank,
           sum(greatest(0, end_ns - greatest(start_ns, coalesce(covered_compute, start_ns)))) FILTER (WHERE NOT is_comm)
               AS compute_ns,
           sum(greatest(0, end_ns - greatest(start_ns, coalesce(covered_all, start_ns)))) AS busy_ns
    FROM reach GROUP BY rank
), comm AS (
    SELECT rank, sum(greatest(0, end_ns - greatest(start_ns, coalesce(covered, start_ns)))) AS communication_ns
    FROM comm_reach GROUP BY rank
), spans AS (  -- a rank's span is a difference of its own times, so its clock offset cancels out
    SELECT rank, max(ts_ns + coalesce(dur_ns, 0)) - min(ts_ns) AS span_ns FROM trace_events
    WHERE run_id = $run AND ph <> 'M' GROUP BY rank
), parts AS (
    SELECT s.rank, s.span_ns, coalesce(t.compute_ns, 0) AS compute_ns, coalesce(c.communication_ns, 0) AS comm_ns,
           coalesce(t.busy_ns, 0) AS busy_ns
    FROM spans s LEFT JOIN totals t USING (rank) LEFT JOIN comm c USING (rank)
)
SELECT $run, rank, span_ns, compute_ns, comm_ns, compute_ns + comm_ns - busy_ns, span_ns - busy_ns,
       100.0 * compute_ns / nullif(span_ns, 0), 100.0 * comm_ns / nullif(span_ns, 0),
       100.0 * (span_ns - busy_ns) / nullif(span_ns, 0), 100.0 * (compute_ns + comm_ns - busy_ns) / nullif(comm_ns, 0)
FROM parts
"""

OP_STATS_SQL = f"""
INSERT INTO op_stats
WITH per_rank AS (
    SELECT rank, name, count(*) AS calls, sum(dur_ns) AS total_ns FROM trace_events
    WHERE run_id = $run AND ph = 'X' AND cat IN ({_WORK}) AND dur_ns >= 0 GROUP BY rank, name
)
SELECT $run, name, count(*), sum(calls), sum(total_ns), avg(total_ns), min(total_ns), max(total_ns),
       arg_max(rank, total_ns), (max(total_ns) - min(total_ns)) / nullif(avg(total_ns), 0),
       row_number() OVER (ORDER BY sum(total_ns) DESC, name)
FROM per_rank GROUP BY name
"""

COMPARE_SQL = """
WITH steps AS (
    SELECT run_id, count(DISTINCT step) AS steps, avg(duration_ns) AS mean_step_ns,
           quantile_cont(duration_ns, 0.5) AS p50_step_ns, quantile_cont(duration_ns, 0.9) AS p90_step_ns,
           avg(busy_ns) AS mean_busy_ns, avg(communication_ns) AS mean_comm_ns
    FROM step_trace WHERE run_id IN ($1, $2) GROUP BY run_id
), ops AS (
    SELECT o.run_id, o.name, o.total_ns / greatest(s.steps, 1) / o.ranks AS per_step_ns
    FROM op_stats o JOIN steps s USING (run_id)
), metric AS (
    SELECT 'step: ' || m.metric AS metric, m.value, s.run_id FROM steps s,
    LATERAL (VALUES ('mean_ns', s.mean_step_ns), ('p50_ns', s.p50_step_ns), ('p90_ns', s.p90_step_ns),
                    ('busy_ns', s.mean_busy_ns), ('communication_ns', s.mean_comm_ns)) m(metric, value)
    UNION ALL
    SELECT 'op per step per rank: ' || name, per_step_ns, run_id FROM ops
)
SELECT metric, max(value) FILTER (WHERE run_id = $1) AS run_a, max(value) FILTER (WHERE run_id = $2) AS run_b,
       max(value) FILTER (WHERE run_id = $2) - max(value) FILTER (WHERE run_id = $1) AS delta,
       max(value) FILTER (WHERE run_id = $2) / nullif(max(value) FILTER (WHERE run_id = $1), 0) AS ratio
FROM metric GROUP BY metric
ORDER BY metric NOT LIKE 'step:%', abs(coalesce(delta, 0)) DESC
LIMIT $3
"""


def analyze_breakdown(db_path: Path, run_id: str) -> None:
    """(Re)build ``temporal_breakdown`` and ``op_stats`` for a run."""
    replace_run_rows(db_path, run_id, "breakdown", ["temporal_breakdown", "op_stats"], [TEMPORAL_SQL, OP_STATS_SQL])


def compare_runs(db_path: Path, run_a: str, run_b: str, limit: int = 25) -> list[dict]:
    """Step-time metrics, then the ops whose per-step time changed most, from ``run_a`` to ``run_b``
    (both analyzed: ``analyze_steps`` and ``analyze_breakdown``)."""
    return connect(db_path).arrow(COMPARE_SQL, [run_a, run_b, limit]).to_pylist()
