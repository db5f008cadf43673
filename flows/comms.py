"""Communication analysis from the Flight Recorder entries (and the profiler where FR has no times).

``analyze_communication`` fills, for a run:

* ``comm_summary``: per group and op, the number of collectives, time, bytes and effective
  bandwidth, and how the time splits into *wait* (inside the collective before the last member
  arrived: a symptom of imbalance, not of the network) and *transfer* (after). NCCL entries carry
  start and completion times. gloo entries carry neither, so their time comes from the backend's
  own spans (``gloo:all_reduce``...) in the profiled steps, matched across ranks by step and order,
  and is scaled to all calls; ``time_source`` says which.
* ``comm_matrix``: rank x rank traffic like MindSpore's communication matrix. Each send goes from
  its rank to its peer; a collective's bytes are split evenly over the group's other members, so
  a rank's row sums to the bytes of its own entries.

Message size is the entry's input tensors (shape times element size): what the rank contributes.
"""

from __future__ import annotations

from pathlib import Path

from rankstream.flows.run_tables import replace_run_rows

__all__ = ["analyze_communication", "COMM_SUMMARY_SQL", "COMM_MATRIX_SQL"]

_BACKEND_SPAN = r"^(gloo|nccl|mpi|ucc|xccl):"

COMM_SUMMARY_SQL = f"""
INSERT INTO comm_summary
WITH calls AS (
    SELECT * FROM run_fr_calls($run)
), arrivals AS (
    SELECT pg_name, seq, max(start_ns) AS last_start FROM calls
    WHERE NOT is_p2p AND seq > 0 AND end_ns IS NOT NULL GROUP BY ALL
), timed AS (
    SELECT c.*, c.end_ns - c.start_ns AS dur_ns,  -- (greatest/least skip NULLs: guard them)
           CASE WHEN a.last_start IS NOT NULL THEN greatest(0, least(a.last_start, c.end_ns) - c.start_ns) END AS wait_ns,
           CASE WHEN a.last_start IS NOT NULL THEN greatest(0, c.end_ns - greatest(c.start_ns, a.last_start)) END
               AS transfer_ns
    FROM calls c LEFT JOIN arrivals a ON NOT c.is_p2p AND a.pg_name = c.pg_name AND a.seq = c.seq
), spans AS (  -- the backend's own spans, k-th of its name in a step matched across ranks
    SELECT rank, lower(split_part(name, ':', 2)) AS op, step, start_ns, end_ns,
           row_number() OVER (PARTITION BY rank, name, step ORDER BY start_ns) AS nth
    FROM run_intervals($run) WHERE regexp_matches(name, '{_BACKEND_SPAN}') AND step IS NOT NULL
), span_arrivals AS (
    SELECT op, step, nth, max(start_ns) AS last_start FROM spans GROUP BY ALL
), profiled AS (
    SELECT s.op, avg(s.end_ns - s.start_ns) AS mean_ns,
           avg(greatest(0, least(a.last_start, s.end_ns) - s.start_ns)) AS mean_wait,
           avg(greatest(0, s.end_ns - greatest(s.start_ns, a.last_start))) AS mean_transfer
    FROM spans s JOIN span_arrivals a USING (op, step, nth) GROUP BY s.op
), per_op AS (
    SELECT pg_name, any_value(pg_desc) AS pg_desc, op,
           CASE WHEN bool_or(is_p2p) THEN count(*) FILTER (WHERE op IN ('send', 'isend'))
                ELSE count(DISTINCT seq) END AS calls,
           count(*) AS rank_entries, sum(dur_ns) AS fr_ns, sum(wait_ns) AS fr_wait, sum(transfer_ns) AS fr_transfer,
           sum(bytes) AS total_bytes
    FROM timed GROUP BY pg_name, op
), joined AS (
    SELECT o.*, p.mean_ns AS p_mean, p.mean_wait AS p_wait, p.mean_transfer AS p_transfer,
           coalesce(o.fr_ns, round(p.mean_ns * o.rank_entries))::BIGINT AS total_ns,
           CASE WHEN o.fr_ns IS NOT NULL THEN 'flight_recorder' WHEN p.mean_ns IS NOT NULL THEN 'profiler' END AS source
    FROM per_op o LEFT JOIN profiled p USING (op)
)
SELECT $run, pg_name, pg_desc, op, calls, rank_entries, total_ns, total_ns / rank_entries, total_bytes,
       total_bytes / rank_entries, total_bytes / nullif(total_ns, 0),
       coalesce(fr_wait, round(p_wait * rank_entries))::BIGINT, coalesce(fr_transfer, round(p_transfer * rank_entries))::BIGINT,
       source
FROM joined
"""

COMM_MATRIX_SQL = r"""
INSERT INTO comm_matrix
WITH calls AS (
    SELECT * FROM run_fr_calls($run)
), listed AS (
    SELECT pg_name, arg_max(ranks, reported_ns) AS ranks FROM process_groups
    WHERE run_id = $run AND len(ranks) > 0 GROUP BY pg_name
), members AS (
    SELECT pg_name, unnest(ranks) AS rank FROM listed
    UNION SELECT DISTINCT pg_name, rank FROM calls WHERE pg_name NOT IN (SELECT pg_name FROM listed)
), group_sizes AS (
    SELECT pg_name, count(*) AS k FROM members GROUP BY ALL
), collective AS (
    SELECT rank, pg_name, count(*) AS ops, sum(bytes) AS bytes, sum(end_ns - start_ns) AS time_ns
    FROM calls WHERE NOT is_p2p GROUP BY ALL
), sends AS (
    SELECT rank, pg_name, bytes, end_ns - start_ns AS time_ns,
           TRY_CAST(regexp_extract(profiling_name, '(\d+)\s*->\s*(\d+)', 2) AS INTEGER) AS peer
    FROM calls WHERE is_p2p AND op IN ('send', 'isend')
), pairs AS (
    SELECT 'collective' AS kind, c.rank AS src, m.rank AS dst, c.ops, c.bytes / (g.k - 1) AS bytes, c.time_ns
    FROM collective c JOIN group_sizes g USING (pg_name)
    JOIN members m ON m.pg_name = c.pg_name AND m.rank <> c.rank
    WHERE g.k > 1
    UNION ALL
    SELECT 'p2p', s.rank, coalesce(l.ranks[s.peer + 1], s.peer), 1, s.bytes, s.time_ns
    FROM sends s LEFT JOIN listed l USING (pg_name) WHERE s.peer IS NOT NULL
)
SELECT $run, kind, src, dst, sum(ops), sum(bytes), sum(time_ns), sum(bytes) / nullif(sum(time_ns), 0)
FROM pairs GROUP BY kind, src, dst
"""


def analyze_communication(db_path: Path, run_id: str) -> None:
    """(Re)build ``comm_summary`` and ``comm_matrix`` for a run."""
    replace_run_rows(db_path, run_id, "communication", tables=["comm_summary", "comm_matrix"],
                     statements=[COMM_SUMMARY_SQL, COMM_MATRIX_SQL])
