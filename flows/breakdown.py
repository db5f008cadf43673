"""Where each rank's time goes (HTA's core breakdowns), and how two runs differ.

``analyze_breakdown`` fills, for a run:

* ``cpu_temporal_breakdown``: per rank, over the rank's traced span, the time its CPU ops spend
  computing (torch ops, runtime calls; kernels are the GPU breakdown's), communicating (collective ops and spans, FR collectives), both at
  once (overlap), and neither (idle). Times are unions of intervals, so nested ops count once;
  the unions come from one sort of each rank's intervals (how far earlier intervals reach: a new
  interval adds only what sticks out), computed in numpy by ``union_lengths``.
* ``op_stats``: per op name, total time on each rank and its spread across ranks; the op a rank
  spends much longer in than its peers is where to look.

``compare_runs`` is HTA's trace diff in SQL: step time and per-step op time of two analyzed runs.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from rankstream.consumers.query import connect
from rankstream.consumers.query_server import register_procedure
from rankstream.flows.run_tables import replace_run_rows

__all__ = ["analyze_breakdown", "compare_runs", "union_lengths", "TEMPORAL_SQL", "OP_STATS_SQL", "WORK_CATEGORIES"]

#: Trace categories of work on the host and on a device (as opposed to annotations wrapping work, or markers).
CPU_CATEGORIES = ("cpu_op", "cuda_runtime", "cuda_driver")
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "mtia_ccp_events")
WORK_CATEGORIES = CPU_CATEGORIES + DEVICE_CATEGORIES

_CPU = ", ".join(f"'{c}'" for c in CPU_CATEGORIES)
_DEVICE = ", ".join(f"'{c}'" for c in DEVICE_CATEGORIES)
_WORK = ", ".join(f"'{c}'" for c in WORK_CATEGORIES)

#: A run's CPU work intervals per rank (device events are the GPU breakdown's): torch ops (compute) and communication
#: (ops and spans named for it, and the rank's FR collectives). Each rank's intervals are on its
#: own clock, the FR calls moved back onto it: a union's length does not depend on where the rank's
#: clock starts, and moving 10M events onto the aligned clock was a third of this query. Names and
#: categories are classified once per distinct pair, not per event.
WORK_INTERVALS_SQL = f"""
WITH work AS MATERIALIZED (
    SELECT name, cat, is_comm FROM (
        SELECT name, cat, coalesce(event_phase(name) = 'communication', false) AS is_comm
        FROM (SELECT DISTINCT name, cat FROM trace_events WHERE run_id = $run))
    WHERE (cat IN ({_CPU}) OR is_comm) AND coalesce(cat, '') NOT IN ({_DEVICE})
), spans AS (
    SELECT rank, name, cat, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns
    FROM trace_events WHERE run_id = $run AND ph = 'X' AND dur_ns >= 0
    UNION ALL
    SELECT rank, name, cat, start_ns, end_ns FROM run_span_pairs($run)
)
SELECT s.rank, w.is_comm, s.start_ns, s.end_ns
FROM spans s JOIN work w ON w.name = s.name AND w.cat IS NOT DISTINCT FROM s.cat
WHERE s.start_ns IS NOT NULL AND s.end_ns IS NOT NULL
UNION ALL
SELECT c.rank, true, c.start_ns + coalesce(o.offset_ns, 0), c.end_ns + coalesce(o.offset_ns, 0)
FROM run_fr_calls($run) c LEFT JOIN rank_offsets($run) o USING (rank) WHERE c.end_ns > c.start_ns
"""

#: Reads ``_unions`` (``union_lengths``) in the same script.
TEMPORAL_SQL = """
INSERT INTO cpu_temporal_breakdown
WITH spans AS (  -- a rank's span is a difference of its own times, so its clock offset cancels out
    SELECT rank, max(ts_ns + coalesce(dur_ns, 0)) - min(ts_ns) AS span_ns FROM trace_events
    WHERE run_id = $run AND ph <> 'M' GROUP BY rank
), parts AS (
    SELECT s.rank, s.span_ns, coalesce(u.compute_ns, 0) AS compute_ns, coalesce(u.comm_ns, 0) AS comm_ns,
           coalesce(u.busy_ns, 0) AS busy_ns
    FROM spans s LEFT JOIN _unions u USING (rank)
)
SELECT $run, rank, span_ns, compute_ns, comm_ns, compute_ns + comm_ns - busy_ns, span_ns - busy_ns,
       100.0 * compute_ns / nullif(span_ns, 0), 100.0 * comm_ns / nullif(span_ns, 0),
       100.0 * (span_ns - busy_ns) / nullif(span_ns, 0), 100.0 * (compute_ns + comm_ns - busy_ns) / nullif(comm_ns, 0)
FROM parts
"""


#: Up to this many ranks, each rank's rows are found by a pass over all of them (``ranks == r``, one
#: rank per worker); past it, one radix sort groups them. At 8 ranks and 10M intervals the passes
#: and the unions took 0.35-0.44 s against 0.47-0.62 s with the sort.
_PASS_PER_RANK = 16


def union_lengths(con, params: dict) -> None:
    """Create ``_unions`` on ``con``: per rank, how long its compute intervals, its communication
    intervals and all its work intervals cover, each counted once however they nest or overlap.

    A union's length is the part of each interval (sorted by start) that the earlier ones do not
    reach. In numpy this is one sort per rank plus running maxima; the same in SQL was a window
    over every interval (about twice as long at 10M events). It runs as a script procedure next
    to the data (registered below as a query-server procedure), so the intervals never leave the process
    that holds the database."""
    intervals = con.sql(WORK_INTERVALS_SQL, params={"run": params["run"]}).fetchnumpy()
    ranks, starts, ends, comm = (np.asarray(intervals[c]) for c in ("rank", "start_ns", "end_ns", "is_comm"))
    lowest = int(ranks.min()) if len(ranks) else 0
    present = np.flatnonzero(np.bincount(ranks - lowest)) + lowest if len(ranks) else np.array([], dtype=np.int64)
    if len(present) <= _PASS_PER_RANK:
        groups, rows_of = present, (lambda rank: np.flatnonzero(ranks == rank))  # one pass per rank, in the workers
    else:  # stable sorts of small integers are radix sorts: cheap even for tens of millions of rows
        by_rank = np.argsort(ranks.astype(np.int16) if ranks.max() < 2**15 else ranks, kind="stable")
        groups, rows_of = np.split(by_rank, np.flatnonzero(np.diff(ranks[by_rank])) + 1), (lambda part: part)

    def rank_unions(group) -> tuple[int, int, int, int]:
        part = rows_of(group)
        part = part[np.argsort(starts[part], kind="stable")]  # mostly in order already: cheap
        start, end, is_comm = starts[part], ends[part], comm[part]
        return (int(ranks[part[0]]), _union_ns(start[~is_comm], end[~is_comm]), _union_ns(start[is_comm], end[is_comm]),
                _union_ns(start, end))

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # numpy's sorts and scans release the GIL
        rows = list(zip(*pool.map(rank_unions, groups))) or [[], [], [], []]
    # a temporary table from plain lists: building Arrow arrays from Python values would make pyarrow
    # import pandas where it is installed, 0.3-0.4 s that the first analysis of a process paid
    con.execute("CREATE OR REPLACE TEMP TABLE _unions AS SELECT unnest($1::INTEGER[]) AS rank, "
                "unnest($2::BIGINT[]) AS compute_ns, unnest($3::BIGINT[]) AS comm_ns, unnest($4::BIGINT[]) AS busy_ns",
                [list(column) for column in rows])


register_procedure("union_lengths", union_lengths)


def _union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    """Length of the union of intervals given sorted by start."""
    if not len(starts):
        return 0
    reach = np.maximum.accumulate(ends)
    covered = np.concatenate((starts[:1], reach[:-1]))  # how far the earlier intervals reach
    return int(np.maximum(0, ends - np.maximum(starts, covered)).sum())


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
    SELECT 'step: ' || m.metric AS metric, m.value / 1e6 AS value, s.run_id FROM steps s,
    LATERAL (VALUES ('mean_ms', s.mean_step_ns), ('p50_ms', s.p50_step_ns), ('p90_ms', s.p90_step_ns),
                    ('busy_ms', s.mean_busy_ns), ('communication_ms', s.mean_comm_ns)) m(metric, value)
    UNION ALL
    SELECT 'op ms per step per rank: ' || name, per_step_ns / 1e6, run_id FROM ops
)
SELECT metric, max(value) FILTER (WHERE run_id = $1) AS run_a, max(value) FILTER (WHERE run_id = $2) AS run_b,
       max(value) FILTER (WHERE run_id = $2) - max(value) FILTER (WHERE run_id = $1) AS delta,
       max(value) FILTER (WHERE run_id = $2) / nullif(max(value) FILTER (WHERE run_id = $1), 0) AS ratio
FROM metric GROUP BY metric
ORDER BY metric NOT LIKE 'step:%', abs(coalesce(delta, 0)) DESC
LIMIT $3
"""


def analyze_breakdown(db_path: Path, run_id: str) -> None:
    """(Re)build ``cpu_temporal_breakdown`` and ``op_stats`` for a run."""
    replace_run_rows(db_path, run_id, "breakdown", tables=["cpu_temporal_breakdown", "op_stats"],
                     statements=["procedure:union_lengths", TEMPORAL_SQL, OP_STATS_SQL])


def compare_runs(db_path: Path, run_a: str, run_b: str, *, limit: int = 25) -> list[dict]:
    """Step-time metrics, then the ops whose per-step time changed most, from ``run_a`` to ``run_b``
    (both analyzed: ``analyze_steps`` and ``analyze_breakdown``)."""
    return connect(db_path).arrow(COMPARE_SQL, [run_a, run_b, limit]).to_pylist()
