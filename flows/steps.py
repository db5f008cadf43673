"""Step analysis: how long each rank's steps take, where the time goes, and who is slow.

``analyze_steps`` fills two tables for a run (declared in ``schemas/analysis_tables.py``):

* ``step_trace``, one row per (step, rank) like MindSpore's step_trace_time: duration split into
  data loading, forward, backward, optimizer and communication, plus MindSpore's iteration
  interval, fp+bp and tail. A phase's time is the union of its intervals inside the step (spans
  from ``rankstream.span`` or ``record_function``, torch ops named for their phase, and the
  rank's Flight Recorder collectives), so nested spans are not counted twice.
* ``rank_slowness``, HTA's straggler view: in a synchronous job every rank's step takes as long
  as the slowest rank's, because the others wait for it inside a collective. So ranks are ranked
  by *busy* time, step duration minus communication: the rank that others wait for is the one
  with the most busy time.

On GPU runs ``step_trace`` also carries each step's NCCL kernel time and the part of it no compute
kernel hides, from ``gpu_step_communication`` (``flows.gpu_streams``, run before this analysis).

Everything is set-based SQL over the aligned clock (``run_intervals``, ``run_steps``): one sort
of the phase intervals does the unions, whatever the number of events.
"""

from __future__ import annotations

from pathlib import Path

from rankstream.flows.breakdown import WORK_CATEGORIES
from rankstream.flows.run_tables import replace_run_rows

__all__ = ["analyze_steps", "STEP_TRACE_SQL", "RANK_SLOWNESS_SQL", "PHASES"]

PHASES = ("data", "forward", "backward", "optimizer", "communication")
#: Ops (as opposed to annotations): the breakdown's work categories plus Python frames (with_stack).
_OPS = ", ".join(f"'{c}'" for c in (*WORK_CATEGORIES, "python_function"))

STEP_TRACE_SQL = f"""
INSERT INTO step_trace
WITH steps AS (
    SELECT rank, step, start_ns, end_ns FROM run_steps($run) WHERE finished  -- an open step has no step time
), names AS MATERIALIZED (  -- classify each distinct name once, not every event (MATERIALIZED keeps
                           -- the optimizer from pushing the regex below the DISTINCT)
    SELECT name, event_phase(name) AS phase FROM (SELECT DISTINCT name FROM trace_events WHERE run_id = $run)
), classified AS (
    SELECT i.rank, n.phase, i.cat IN ({_OPS}) AS is_op, i.start_ns, i.end_ns
    FROM run_intervals($run) i JOIN names n USING (name) WHERE n.phase IS NOT NULL
), annotated AS (  -- phases a rank annotates: their spans cover their ops, which add nothing
    SELECT DISTINCT rank, phase FROM classified WHERE NOT is_op
), phased AS (
    SELECT c.rank, c.phase, c.start_ns, c.end_ns FROM classified c
    WHERE NOT c.is_op OR NOT EXISTS (SELECT 1 FROM annotated a WHERE a.rank = c.rank AND a.phase = c.phase)
    UNION ALL
    SELECT rank, 'communication', start_ns, end_ns FROM run_fr_calls($run) WHERE end_ns > start_ns
), placed AS (  -- each interval into the step it starts in, clipped to the step
    SELECT p.rank, s.step, p.phase, p.start_ns, least(p.end_ns, s.end_ns) AS end_ns
    FROM phased p ASOF JOIN steps s ON p.rank = s.rank AND p.start_ns >= s.start_ns
    WHERE p.start_ns < s.end_ns
), tagged AS (
    SELECT * FROM placed UNION ALL SELECT rank, step, 'any', start_ns, end_ns FROM placed
), reach AS (
    SELECT *, max(end_ns) OVER (  -- one integer partition key sorts several times faster than three columns
                  PARTITION BY (rank::BIGINT << 44) | (step << 4) | list_position({list(('any',) + PHASES)}, phase)
                  ORDER BY start_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered_to
    FROM tagged
), phase_time AS (  -- union length: the part of each interval not covered by earlier ones
    SELECT rank, step, phase, sum(greatest(0, end_ns - greatest(start_ns, coalesce(covered_to, start_ns)))) AS ns,
           min(start_ns) AS first_ns, max(end_ns) AS last_ns
    FROM reach GROUP BY ALL
), per_step AS (
    SELECT s.rank, s.step, s.start_ns, s.end_ns, s.end_ns - s.start_ns AS duration_ns,
           coalesce(max(p.ns) FILTER (WHERE p.phase = 'data'), 0) AS data_ns,
           coalesce(max(p.ns) FILTER (WHERE p.phase = 'forward'), 0) AS forward_ns,
           coalesce(max(p.ns) FILTER (WHERE p.phase = 'backward'), 0) AS backward_ns,
           coalesce(max(p.ns) FILTER (WHERE p.phase = 'optimizer'), 0) AS optimizer_ns,
           coalesce(max(p.ns) FILTER (WHERE p.phase = 'communication'), 0) AS communication_ns,
           coalesce(max(p.ns) FILTER (WHERE p.phase = 'any'), 0) AS any_ns,
           max(p.first_ns) FILTER (WHERE p.phase = 'forward') AS forward_start,
           max(p.last_ns) FILTER (WHERE p.phase = 'backward') AS backward_end
    FROM steps s LEFT JOIN phase_time p USING (rank, step)
    GROUP BY ALL
)
SELECT $run, rank, step, start_ns, end_ns, duration_ns, data_ns, forward_ns, backward_ns, optimizer_ns,
       communication_ns, duration_ns - any_ns AS other_ns, duration_ns - communication_ns AS busy_ns,
       forward_start - start_ns AS iteration_interval_ns, backward_end - forward_start AS fp_bp_ns,
       end_ns - backward_end AS tail_ns,
       row_number() OVER (PARTITION BY step ORDER BY duration_ns - communication_ns DESC, rank) AS slowest_order,
       g.gpu_communication_ns, g.exposed_communication_ns
FROM per_step LEFT JOIN (SELECT rank, step, communication_ns AS gpu_communication_ns, exposed_communication_ns
                         FROM gpu_step_communication WHERE run_id = $run) g USING (rank, step)
"""

RANK_SLOWNESS_SQL = """
INSERT INTO rank_slowness
WITH per_rank AS (
    SELECT rank, count(*) AS steps, avg(duration_ns) AS mean_step_ns, avg(busy_ns) AS mean_busy_ns,
           count(*) FILTER (WHERE slowest_order = 1) AS times_slowest
    FROM step_trace WHERE run_id = $run GROUP BY rank
), typical AS (
    SELECT median(mean_busy_ns) AS busy FROM per_rank
)
SELECT $run, rank, steps, mean_step_ns, mean_busy_ns, mean_busy_ns / nullif((SELECT busy FROM typical), 0),
       times_slowest, row_number() OVER (ORDER BY mean_busy_ns DESC, times_slowest DESC, rank)
FROM per_rank
"""


def analyze_steps(db_path: Path, run_id: str) -> None:
    """(Re)build ``step_trace`` and ``rank_slowness`` for a run."""
    replace_run_rows(db_path, run_id, "steps", tables=["step_trace", "rank_slowness"], statements=[STEP_TRACE_SQL, RANK_SLOWNESS_SQL])
