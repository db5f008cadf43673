"""What happens on each GPU stream, by Holistic Trace Analysis's rules: why a stream sits idle, how
many launches wait on it, how long launches take to start, the memory bandwidth, and how much
NCCL time each step leaves exposed.

Each statement reads ``_hta_events`` (``run_hta_events``: the run's events as HTA loads them, the
last profiler step dropped unless asked), which ``flows.gpu_breakdown`` builds once per analysis,
and fills one table (declared in ``schemas/analysis_tables.py``; the rules are in docs/design.md):

* ``gpu_idle_time``: each gap between consecutive kernel/memcpy/memset events of a stream is
  *host wait* when the next event's launch call started after the previous event ended (the GPU
  waited for the CPU), *kernel wait* when not and the gap is under 30 us (launch overhead between
  back-to-back kernels), *other* otherwise;
* ``gpu_queue_length``: +1 at each launch call, -1 when its GPU event starts, summarised per stream;
* ``gpu_kernel_launches`` and ``gpu_launch_summary``: per launch, the call's CPU time, the GPU
  event's time and the delay between them, flagged with HTA's plot cutoffs;
* ``gpu_memory_bandwidth``: per memcpy/memset kind, the bandwidth of the events running at once;
* ``gpu_step_communication``: per step, the NCCL kernels' time and the part no compute kernel hides.

HTA's summaries (queue length, bandwidth) describe the series at its change points, unweighted by
time; these do the same so that figures compare column by column. Unlike HTA's launch stats, which
skip ``cuLaunchKernel`` and every ``hip*`` call (and so return nothing on ROCm traces), every launch
call the queue length counts is counted here; ``launch_call`` tells them apart.
"""

from __future__ import annotations

import numpy as np

from rankstream.consumers.query_server import register_procedure
from rankstream.flows.intervals import covered_ns, merged_intervals

__all__ = ["GPU_STREAM_TABLES", "GPU_STREAM_STATEMENTS", "LAUNCH_CALLS", "KERNEL_WAIT_NS", "gpu_step_communication"]

GPU_STREAM_TABLES = ["gpu_idle_time", "gpu_queue_length", "gpu_kernel_launches", "gpu_launch_summary",
                     "gpu_memory_bandwidth", "gpu_step_communication"]

#: Runtime and driver calls that put work on a stream (HTA's list, ROCm's twins included).
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync",
                "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipMemcpyAsync", "hipMemsetAsync",
                "hipMemcpyWithStream", "runFunction - job_prep_and_submit_for_execution")
#: A gap shorter than this between kernels whose launch came in time is the launch overhead (HTA's default).
KERNEL_WAIT_NS = 30_000
#: HTA's plot cutoffs: a launch call longer than this is an outlier ...
LONG_LAUNCH_CALL_NS = 50_000
#: ... and so is a launch that waits longer than this before its GPU event starts.
LONG_LAUNCH_DELAY_NS = 100_000
#: The kinds of GPU event HTA's idle-time breakdown looks at (kernels, memcpy, memset).
_IDLE_CATEGORIES = ("kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events")


def _quoted(names) -> str:
    return ", ".join("'" + name.replace("'", "''") + "'" for name in names)


#: When each GPU event's launch call started: the CPU event with its correlation id (the latest,
#: where several share one, as HTA pairs them).
_LAUNCH_TIMES = """
    SELECT rank, correlation, max(start_ns) AS launch_ns FROM _hta_events
    WHERE NOT is_gpu AND correlation IS NOT NULL GROUP BY ALL
"""

IDLE_SQL = f"""
INSERT INTO gpu_idle_time
WITH launches AS ({_LAUNCH_TIMES}
), kernels AS (
    SELECT g.rank, g.stream, g.start_ns, l.launch_ns,
           lag(g.end_ns) OVER (PARTITION BY g.rank, g.stream ORDER BY g.start_ns, g.end_ns) AS previous_end_ns
    FROM _hta_events g LEFT JOIN launches l USING (rank, correlation)
    WHERE g.is_gpu AND g.cat IN ({_quoted(_IDLE_CATEGORIES)})
), gaps AS (
    SELECT rank, stream, start_ns - previous_end_ns AS gap_ns,
           CASE WHEN previous_end_ns IS NULL THEN 'other'
                WHEN launch_ns > previous_end_ns THEN 'host_wait'
                WHEN start_ns - previous_end_ns < {KERNEL_WAIT_NS} THEN 'kernel_wait'
                ELSE 'other' END AS category
    FROM kernels
), per_category AS (
    SELECT rank, stream, category, coalesce(sum(gap_ns), 0) AS idle_ns, count(gap_ns) AS gaps FROM gaps GROUP BY ALL
)
SELECT $run, rank, stream, category, idle_ns, idle_ns / nullif(sum(idle_ns) OVER (PARTITION BY rank, stream), 0), gaps
FROM per_category
"""

#: Each launch call and the GPU event it started (same rank and correlation id), joined once for
#: the queue length and the launch stats.
LAUNCH_PAIRS_SQL = f"""
CREATE OR REPLACE TEMP TABLE _launch_pairs AS
    SELECT c.rank, c.correlation, c.name AS launch_call, g.name, g.stream, c.start_ns AS call_start_ns,
           c.end_ns AS call_end_ns, g.start_ns AS gpu_start_ns, g.end_ns AS gpu_end_ns
    FROM _hta_events c JOIN _hta_events g ON g.is_gpu AND g.rank = c.rank AND g.correlation = c.correlation
    WHERE NOT c.is_gpu AND c.name IN ({_quoted(LAUNCH_CALLS)})
"""


def _describe(value: str) -> str:
    """HTA's ``describe()`` columns (count, mean, sample std, min, quartiles, max) of ``value``."""
    return (f"count(*), avg({value}), stddev_samp({value}), min({value}), quantile_cont({value}, 0.25), "
            f"quantile_cont({value}, 0.5), quantile_cont({value}, 0.75), max({value})")


QUEUE_SQL = f"""
INSERT INTO gpu_queue_length
WITH points AS (  -- at the same instant a launch counts before an event starts
    SELECT rank, stream, call_start_ns AS at_ns, 1 AS delta, 0 AS tie FROM _launch_pairs
    UNION ALL
    SELECT rank, stream, gpu_start_ns, -1, 1 FROM _launch_pairs
), series AS (
    SELECT rank, stream,
           sum(delta) OVER (PARTITION BY rank, stream ORDER BY at_ns, tie ROWS UNBOUNDED PRECEDING) AS queue_length
    FROM points
)
SELECT $run, rank, stream, {_describe("queue_length")} FROM series GROUP BY ALL
"""

LAUNCHES_SQL = f"""
INSERT INTO gpu_kernel_launches
SELECT $run, rank, correlation, launch_call, name, stream, cpu_duration, gpu_duration, launch_delay,
       cpu_duration > {LONG_LAUNCH_CALL_NS}, launch_delay > {LONG_LAUNCH_DELAY_NS},
       cpu_duration <= {LONG_LAUNCH_CALL_NS} AND gpu_duration < cpu_duration
FROM (SELECT *, call_end_ns - call_start_ns AS cpu_duration, gpu_end_ns - gpu_start_ns AS gpu_duration,
             greatest(gpu_start_ns - call_end_ns, 0) AS launch_delay FROM _launch_pairs)
"""

LAUNCH_SUMMARY_SQL = """
INSERT INTO gpu_launch_summary
SELECT $run, rank, count(*), count(*) FILTER (WHERE long_launch_call), count(*) FILTER (WHERE long_launch_delay),
       count(*) FILTER (WHERE short_kernel), median(cpu_duration), max(cpu_duration), median(launch_delay),
       quantile_cont(launch_delay, 0.99), max(launch_delay)
FROM gpu_kernel_launches WHERE run_id = $run GROUP BY rank
"""

#: HTA's memory kinds; an event of no duration counts as one microsecond (HTA's rule).
MEMORY_BANDWIDTH_SQL = f"""
INSERT INTO gpu_memory_bandwidth
WITH memory AS (
    SELECT rank, CASE WHEN name LIKE 'Memset%' THEN 'Memset' WHEN name NOT LIKE 'Memcpy%' THEN 'Memcpy Unknown'
                      ELSE left(name, 11) END AS kind,
           start_ns, CASE WHEN end_ns = start_ns THEN start_ns + 1000 ELSE end_ns END AS end_ns,
           coalesce(bandwidth_gb_s, 0) AS gb_s
    FROM _hta_events WHERE is_gpu AND kernel_type = 'MEMORY'
), changes AS (  -- one point per instant: the events ending then do not run with those starting then
    SELECT rank, kind, at_ns, sum(delta) AS delta FROM (
        SELECT rank, kind, start_ns AS at_ns, gb_s AS delta FROM memory
        UNION ALL
        SELECT rank, kind, end_ns, -gb_s FROM memory)
    GROUP BY ALL
), series AS (
    SELECT rank, kind, sum(delta) OVER (PARTITION BY rank, kind ORDER BY at_ns ROWS UNBOUNDED PRECEDING) AS gb_s
    FROM changes
)  -- a running sum of doubles leaves residues like 4e-15 where nothing runs: those are not bandwidth
SELECT $run, rank, kind, {_describe("gb_s")} FROM series WHERE gb_s > 1e-9 GROUP BY ALL
"""

#: Each COMPUTATION and COMMUNICATION event with the step whose span (on the rank's own clock)
#: holds its launch call.
_STEP_KERNELS_SQL = f"""
WITH launches AS ({_LAUNCH_TIMES}
), steps AS (
    SELECT s.rank, s.step, s.start_ns + coalesce(o.offset_ns, 0) AS start_ns, s.end_ns + coalesce(o.offset_ns, 0) AS end_ns
    FROM run_steps($run) s LEFT JOIN rank_offsets($run) o USING (rank) WHERE s.finished
), kernels AS (
    SELECT g.rank, g.kernel_type = 'COMMUNICATION' AS is_comm, g.start_ns, g.end_ns, l.launch_ns
    FROM _hta_events g LEFT JOIN launches l USING (rank, correlation)
    WHERE g.is_gpu AND g.kernel_type IN ('COMPUTATION', 'COMMUNICATION')
)
SELECT k.rank, k.is_comm, k.start_ns, k.end_ns, CASE WHEN k.launch_ns < s.end_ns THEN s.step END AS step
FROM kernels k ASOF LEFT JOIN steps s ON k.rank = s.rank AND k.launch_ns >= s.start_ns
"""


def gpu_step_communication(con, params: dict) -> None:
    """Create ``_gpu_step_comm`` on ``con``: per rank and step, the union of the communication
    kernels launched in the step, and how much of it lies outside every compute kernel of the rank
    (whatever step launched them). Registered below as a query-server procedure."""
    rows = con.sql(_STEP_KERNELS_SQL, params={"run": params["run"]}).fetchnumpy()
    in_step = ~np.ma.getmaskarray(rows["step"])
    ranks, steps = np.asarray(rows["rank"]), np.ma.getdata(rows["step"]).astype(np.int64)
    is_comm, starts, ends = np.asarray(rows["is_comm"]), np.asarray(rows["start_ns"]), np.asarray(rows["end_ns"])
    out: list[np.ndarray] = []
    for rank in np.unique(ranks).tolist():
        mine = ranks == rank
        compute = merged_intervals(starts[mine & ~is_comm], ends[mine & ~is_comm])
        comm = mine & is_comm & in_step
        if comm.any():
            step_ids, comm_starts, comm_ends = _unions_per_step(steps[comm], starts[comm], ends[comm])
            lengths, hidden = comm_ends - comm_starts, covered_ns(compute, comm_starts, comm_ends)
            unique_steps, slot = np.unique(step_ids, return_inverse=True)
            total = np.bincount(slot, weights=lengths).astype(np.int64)
            exposed = total - np.bincount(slot, weights=hidden).astype(np.int64)
            out.append(np.c_[np.full(len(unique_steps), rank), unique_steps, total, exposed])
    columns = [c.tolist() for c in np.concatenate(out).T] if out else [[], [], [], []]
    con.execute("CREATE OR REPLACE TEMP TABLE _gpu_step_comm AS SELECT unnest($1::INTEGER[]) AS rank, "
                "unnest($2::BIGINT[]) AS step, unnest($3::BIGINT[]) AS communication_ns, "
                "unnest($4::BIGINT[]) AS exposed_ns", columns)


def _unions_per_step(steps: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """The union of each step's intervals in one pass: each step's intervals are moved, from its
    own first start, into a slot of their own as wide as the widest step, so one merge never joins
    two steps (the slots together span about the run's length: no overflow)."""
    unique_steps, slot = np.unique(steps, return_inverse=True)
    first = np.full(len(unique_steps), np.iinfo(np.int64).max)
    np.minimum.at(first, slot, starts)
    width = int((np.maximum(starts, ends) - first[slot]).max()) + 1
    shift = slot.astype(np.int64) * width - first[slot]
    merged_starts, merged_ends = merged_intervals(starts + shift, ends + shift)
    merged_slot = merged_starts // width
    back = merged_slot * width - first[merged_slot]
    return unique_steps[merged_slot], merged_starts - back, merged_ends - back


register_procedure("gpu_step_communication", gpu_step_communication)

STEP_COMMUNICATION_SQL = """
INSERT INTO gpu_step_communication
SELECT $run, rank, step, communication_ns, exposed_ns, 100.0 * exposed_ns / nullif(communication_ns, 0)
FROM _gpu_step_comm
"""

#: In order, after ``_hta_events`` exists.
GPU_STREAM_STATEMENTS = [IDLE_SQL, LAUNCH_PAIRS_SQL, QUEUE_SQL, LAUNCHES_SQL, LAUNCH_SUMMARY_SQL, MEMORY_BANDWIDTH_SQL,
                         "procedure:gpu_step_communication", STEP_COMMUNICATION_SQL]
