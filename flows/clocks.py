"""Clock alignment: one clock for all ranks of a run (what a cross-rank merge stands on).

Each rank stamps its events with its own wall clock; hosts disagree by microseconds to seconds.
``align_clocks`` estimates, per rank, ``offset = rank's clock - reference rank's clock`` from every
source the run has, keeps all estimates in ``clock_offsets`` and marks the best one ``chosen``:

1. **barrier** (preferred): the clock-sync samples every rank takes between two store barriers
   (``producers.clock_sync``; Composer's ``clock_sync_timestamp_us`` in imported traces). All
   ranks read their clocks inside the same real interval, no longer than the shortest barrier
   round trip, so each round gives ``offset in [d - bound, d + bound]``. Unlike Composer, which
   takes one sample and ignores its bound, the rounds' intervals are intersected: the result is
   the midpoint and the half-width is a real error bound. If rounds disagree (clock drift), the
   tightest single round is used and ``detail`` says so.
2. **flight_recorder**: a collective completes at nearly the same moment on all its members, so
   the median difference of completion times over matched collectives estimates the offset
   (error: half the interquartile range; a spread, not a bound). Used when there are no barrier
   samples (imported dumps), and always reported as a cross-check.
3. **profiler_steps**: Kineto's timeline, placed on each rank's wall clock with its
   ``baseTimeNanoseconds`` at import, starts ``ProfilerStep#N`` at nearly the same moment on every
   rank of a synchronous job; the median difference is a coarse estimate for traces with nothing
   else.

Ranks on the reference rank's host (``rank_metadata.host``) read the same wall clock: their offset
is 0 with no error (source ``same_host``), whatever the sources above estimate; an estimate's
error there is the estimate's, not the clocks' (a single-host run read offsets up to 74 ms and
error bounds up to 365 ms from one barrier round, and its 100 ms straggler went unseen below them).
Ranks with no estimate get offset 0 (source ``none``). ``aligned_events`` and every analysis apply
the chosen offsets, so running the alignment again re-aligns everything, live runs included.
"""

from __future__ import annotations

from pathlib import Path

from rankstream.consumers.query import Database, connect
from rankstream.flows.run_tables import replace_run_rows

__all__ = ["align_clocks", "clock_offsets", "rank_offsets", "OFFSETS_SQL"]

#: Each rank's host (``rank_metadata.host``): processes of one host read one wall clock.
_HOSTS = """hosts AS (
    SELECT rank, any_value(host) AS host FROM rank_metadata
    WHERE run_id = $run AND host IS NOT NULL AND host <> '' GROUP BY rank
)"""

OFFSETS_SQL = f"""
INSERT INTO clock_offsets
WITH run_ranks AS (
    SELECT rank FROM rank_metadata WHERE run_id = $run
    UNION SELECT DISTINCT rank FROM trace_events WHERE run_id = $run
    UNION SELECT DISTINCT rank FROM fr_entries WHERE run_id = $run
), reference AS (
    SELECT min(rank) AS rank FROM run_ranks
), {_HOSTS}, same_host AS (  -- processes of one host read one wall clock: nothing to estimate
    SELECT h.rank FROM hosts h JOIN hosts r ON r.rank = (SELECT rank FROM reference) AND r.host = h.host
), composer AS (  -- imported Composer traces carry their clock sync as metadata events, in us
    SELECT rank, name, TRY_CAST(args->>'$.value' AS BIGINT) * 1000 AS value_ns,
           row_number() OVER (PARTITION BY rank, name ORDER BY ts_ns) AS nth
    FROM trace_events
    WHERE run_id = $run AND ph = 'M' AND name IN ('clock_sync_timestamp_us', 'clock_sync_error_bound')
), samples AS (
    SELECT DISTINCT rank, coalesce(clock_round, -1) AS round, clock_sync_ns AS sync_ns, clock_error_ns AS bound_ns
    FROM rank_metadata WHERE run_id = $run AND clock_sync_ns IS NOT NULL AND clock_error_ns IS NOT NULL
    UNION ALL
    SELECT t.rank, 1000000 + t.nth, t.value_ns, coalesce(b.value_ns, 0)
    FROM composer t LEFT JOIN composer b ON b.rank = t.rank AND b.nth = t.nth AND b.name = 'clock_sync_error_bound'
    WHERE t.name = 'clock_sync_timestamp_us' AND t.value_ns IS NOT NULL
), round_bounds AS (  -- every rank read its clock inside the same interval, no longer than any one's round trip
    SELECT round, min(bound_ns) AS bound FROM samples GROUP BY round
), barrier_rounds AS (
    SELECT s.rank, s.sync_ns - r.sync_ns AS d, b.bound
    FROM samples s JOIN samples r ON r.round = s.round AND r.rank = (SELECT rank FROM reference)
    JOIN round_bounds b ON b.round = s.round
), barrier AS (
    SELECT rank, max(d - bound) AS lo, min(d + bound) AS hi, arg_min(d, bound) AS best_d, min(bound) AS best_bound,
           count(*) AS n
    FROM barrier_rounds GROUP BY rank
), completions AS (
    SELECT rank, pg_name, collective_seq_id AS seq, max(time_discovered_completed_ns) AS done_ns
    FROM fr_entries
    WHERE run_id = $run AND time_discovered_completed_ns > 0 AND collective_seq_id > 0 AND NOT coalesce(is_p2p, false)
    GROUP BY ALL
), fr AS (
    SELECT c.rank, median(c.done_ns - r.done_ns)::BIGINT AS offset_ns,
           ((quantile_cont(c.done_ns - r.done_ns, 0.75) - quantile_cont(c.done_ns - r.done_ns, 0.25)) / 2)::BIGINT AS spread,
           count(*) AS n
    FROM completions c JOIN completions r
      ON r.rank = (SELECT rank FROM reference) AND r.pg_name = c.pg_name AND r.seq = c.seq
    GROUP BY c.rank
), step_starts AS (
    SELECT rank, name, min(ts_ns) AS start_ns FROM trace_events
    WHERE run_id = $run AND ph = 'X' AND name LIKE 'ProfilerStep#%' GROUP BY ALL
), profiler AS (
    SELECT s.rank, median(s.start_ns - r.start_ns)::BIGINT AS offset_ns,
           ((quantile_cont(s.start_ns - r.start_ns, 0.75) - quantile_cont(s.start_ns - r.start_ns, 0.25)) / 2)::BIGINT AS spread,
           count(*) AS n
    FROM step_starts s JOIN step_starts r ON r.rank = (SELECT rank FROM reference) AND r.name = s.name
    GROUP BY s.rank
), estimates AS (
    SELECT rank, 'same_host' AS source, 0 AS preference, 0 AS offset_ns, 0 AS error_ns, 1 AS samples,
           'on the reference rank''s host: the same wall clock' AS detail
    FROM same_host
    UNION ALL
    SELECT rank, 'barrier', 1,
           CASE WHEN lo <= hi THEN (lo + hi) // 2 ELSE best_d END AS offset_ns,
           CASE WHEN lo <= hi THEN (hi - lo) // 2 ELSE best_bound END AS error_ns, n AS samples,
           CASE WHEN lo <= hi THEN printf('%d clock-sync rounds intersected', n)
                ELSE printf('%d rounds disagree (clock drift?): tightest round used', n) END AS detail
    FROM barrier
    UNION ALL
    SELECT rank, 'flight_recorder', 2, offset_ns, spread, n,
           printf('median over %d collectives completed on both ranks; error is half the IQR', n)
    FROM fr
    UNION ALL
    SELECT rank, 'profiler_steps', 3, offset_ns, spread, n,
           printf('median over %d ProfilerStep starts; assumes steps start together', n)
    FROM profiler
    UNION ALL
    SELECT rank, 'none', 4, 0, NULL, 0, 'no clock information: taken as is' FROM run_ranks
)
SELECT $run, e.rank, (SELECT rank FROM reference), e.source, e.offset_ns, e.error_ns, e.samples,
       row_number() OVER (PARTITION BY e.rank ORDER BY e.preference) = 1 AS chosen, e.detail
FROM estimates e
WHERE e.source <> 'none' OR NOT EXISTS (SELECT 1 FROM estimates x WHERE x.rank = e.rank AND x.source <> 'none')
"""


def align_clocks(db_path: Path | Database, run_id: str) -> None:
    """(Re)compute ``clock_offsets`` for a run; ``aligned_events`` follows at once."""
    replace_run_rows(db_path, run_id, "clocks", tables=["clock_offsets"], statements=[OFFSETS_SQL])


def clock_offsets(db_path: Path | Database, run_id: str) -> list[dict]:
    """Every estimate of the run, with whether the sources agree within their bounds."""
    table = connect(db_path).arrow("""
        SELECT o.rank, o.source, o.offset_ns, o.error_ns, o.samples, o.chosen, o.detail,
               abs(o.offset_ns - c.offset_ns) <= coalesce(o.error_ns, 0) + coalesce(c.error_ns, 0) AS agrees
        FROM clock_offsets o JOIN clock_offsets c ON c.run_id = o.run_id AND c.rank = o.rank AND c.chosen
        WHERE o.run_id = $1 ORDER BY o.rank, o.chosen DESC, o.source""", [run_id])
    return table.to_pylist()


#: Each rank's offset for reading its timestamps on one clock: the run's chosen alignment if it was
#: aligned, else the tightest clock-sync round every rank took part in (a live run is not aligned
#: until its analyses run, and its heartbeats already carry the samples).
RANK_OFFSETS_SQL = f"""
WITH aligned AS (
    SELECT rank, offset_ns, coalesce(error_ns, 0) AS error_ns FROM clock_offsets WHERE run_id = $run AND chosen
), samples AS (
    SELECT DISTINCT rank, clock_round AS round, clock_sync_ns AS sync_ns, clock_error_ns AS bound_ns
    FROM rank_metadata WHERE run_id = $run AND clock_sync_ns IS NOT NULL AND clock_error_ns IS NOT NULL
), rounds AS (
    SELECT round, min(bound_ns) AS bound, min(rank) AS reference FROM samples GROUP BY round
    HAVING count(DISTINCT rank) = (SELECT count(DISTINCT rank) FROM samples)
), tightest AS (
    SELECT * FROM rounds ORDER BY bound, round DESC LIMIT 1
), {_HOSTS}, synced AS (  -- ranks on the reference's host read its very clock
    SELECT s.rank, CASE WHEN hs.host = hr.host THEN 0 ELSE s.sync_ns - r.sync_ns END AS offset_ns,
           CASE WHEN hs.host = hr.host THEN 0 ELSE t.bound END AS error_ns
    FROM tightest t JOIN samples s ON s.round = t.round JOIN samples r ON r.round = t.round AND r.rank = t.reference
    LEFT JOIN hosts hs ON hs.rank = s.rank LEFT JOIN hosts hr ON hr.rank = t.reference
)
SELECT * FROM aligned UNION ALL SELECT * FROM synced WHERE NOT EXISTS (SELECT 1 FROM aligned)
"""


def rank_offsets(database: Database, run_id: str) -> tuple[dict[int, int], int]:
    """``({rank: offset_ns}, error_ns)``: subtract a rank's offset from its timestamps to read them on
    the reference rank's clock; two ranks' readings then disagree by at most ``error_ns`` more.
    Ranks without an estimate are taken as they are (no offsets at all: ``({}, 0)``)."""
    rows = database.fetchall(RANK_OFFSETS_SQL, {"run": run_id})
    return {rank: offset for rank, offset, _ in rows}, 2 * max((error for _, _, error in rows), default=0)
