"""Timeline: a run as a Chrome trace (chrome://tracing, Perfetto), written as a stream.

``write_timeline`` reads the run on the aligned clock (``flows.clocks``) and writes one JSON object
``{"traceEvents": [...], "otherData": {...}}``, ``.json`` or ``.json.gz``:

* per rank a process (pid = rank) named and sorted by rank, its threads named as the rank named them;
* every span as a complete (``X``) event: B/E pairs are matched in SQL first (``run_intervals``),
  so the file never holds an unmatched B or E, even when a rank died inside a span;
* instants, counters (memory, user counters) as they were;
* each rank's Flight Recorder collectives as slices on one "collectives" track per group (an
  instant where the backend records no completion time, as gloo does);
* the run's findings (desyncs, hangs, stragglers) and live findings as global instant markers.

Timestamps are microseconds since the run's first event (``otherData.t0_ns`` gives the epoch),
which keeps nanosecond digits that absolute microseconds would lose in a double.

The file is built in SQL, one slice of at most ``SLICE_EVENTS`` events of one rank at a time, and
written as it comes, so memory does not grow with the run. Where MindSpore silently truncates at its
``timeline_limit``, a cap (``max_events``) here splits the output into several files by step range
and says so in the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator


from rankstream.consumers.query import Database, connect
from rankstream.flows.chrome_writer import ChromeTraceWriter
from rankstream.schemas.errors import BadInput
from rankstream.flows.run_tables import bind, ensure_schema

__all__ = ["write_timeline", "TimelineResult", "COLLECTIVES_TID_BASE"]

#: Collectives tracks use tids far above any OS thread id, one per process group.
COLLECTIVES_TID_BASE = 1 << 40
_US = "round(({ts} - $t0) / 1000.0, 3)"

#: One slice of one rank. The slice's bounds are moved onto the rank's own clock ($own_lo, $own_hi:
#: the aligned bounds plus its offset) rather than every stored time onto the aligned one, so the
#: scan reads only the row groups of the slice; a slice used to cost a pass over the whole run.
_EVENTS_SQL = f"""
WITH window_events AS (
    SELECT * FROM trace_events WHERE run_id = $run AND rank = $rank AND ts_ns >= $own_lo AND ts_ns < $own_hi
), spans AS (
    SELECT * FROM run_own_intervals($run) WHERE rank = $rank AND start_ns >= $own_lo AND start_ns < $own_hi
)
SELECT to_json({{name: name, cat: coalesce(cat, ''), ph: 'X', ts: {_US.format(ts="start_ns - $offset")},
                dur: round((end_ns - start_ns) / 1000.0, 3), pid: $rank, tid: tid,
                args: CASE WHEN unfinished THEN json_merge_patch(coalesce(TRY_CAST(args AS JSON), '{{}}'),
                                                                 '{{"unfinished": true}}')
                           ELSE coalesce(TRY_CAST(args AS JSON), '{{}}'::JSON) END}}) AS line
FROM spans
UNION ALL
SELECT to_json({{name: name, cat: coalesce(cat, ''), ph: 'i', s: 't', ts: {_US.format(ts="ts_ns - $offset")},
                pid: $rank, tid: tid, args: coalesce(TRY_CAST(args AS JSON), '{{}}'::JSON)}})
FROM window_events WHERE ph IN ('i', 'I', 'n')
UNION ALL
SELECT to_json({{name: name, cat: coalesce(cat, ''), ph: 'C', ts: {_US.format(ts="ts_ns - $offset")}, pid: $rank,
                tid: tid, args: coalesce(TRY_CAST(args AS JSON), '{{}}'::JSON)}})
FROM window_events WHERE ph = 'C'
UNION ALL
SELECT to_json({{name: name, cat: coalesce(cat, 'flow'), ph: ph, ts: {_US.format(ts="ts_ns - $offset")}, pid: $rank,
                tid: tid, id: ($rank::BIGINT << 40) | flow_id, bp: 'e'}})
FROM window_events WHERE ph IN ('s', 't', 'f') AND flow_id IS NOT NULL
UNION ALL
SELECT CASE WHEN end_ns > start_ns
    THEN to_json({{name: op || ' #' || coalesce(seq, record_id), cat: 'collective', ph: 'X',
                  ts: {_US.format(ts="start_ns")}, dur: round((end_ns - start_ns) / 1000.0, 3), pid: rank,
                  tid: $base + list_position($pgs, pg_name), args: {{pg: pg_name, pg_desc: pg_desc, seq: seq,
                  record_id: record_id, bytes: bytes, state: state}}}})
    ELSE to_json({{name: op || ' #' || coalesce(seq, record_id), cat: 'collective', ph: 'i', s: 't',
                  ts: {_US.format(ts="start_ns")}, pid: rank, tid: $base + list_position($pgs, pg_name),
                  args: {{pg: pg_name, pg_desc: pg_desc, seq: seq, record_id: record_id, bytes: bytes, state: state}}}})
    END
FROM run_fr_calls($run) c
WHERE c.rank = $rank AND c.start_ns >= $lo AND c.start_ns < $hi
"""

_METADATA_SQL = """
SELECT to_json({name: 'process_name', ph: 'M', ts: 0, pid: rank, tid: 0,
                args: {name: 'rank ' || rank || coalesce(' (' || any_value(host) || ')', '')}}) AS line
FROM (SELECT $rank AS rank, host FROM ranks WHERE run_id = $run AND rank = $rank UNION ALL SELECT $rank, NULL)
GROUP BY rank
UNION ALL
SELECT to_json({name: 'process_sort_index', ph: 'M', ts: 0, pid: $rank, tid: 0, args: {sort_index: $rank}})
UNION ALL
SELECT to_json({name: 'thread_name', ph: 'M', ts: 0, pid: $rank, tid: tid, args: {name: arg_max(args->>'$.name', ts_ns)}})
FROM trace_events WHERE run_id = $run AND rank = $rank AND ph = 'M' AND name = 'thread_name' GROUP BY tid
UNION ALL
SELECT to_json({name: 'thread_name', ph: 'M', ts: 0, pid: $rank, tid: $base + i,
                args: {name: 'collectives: ' || coalesce($descs[i], '') || ' (pg ' || $pgs[i] || ')'}})
FROM range(1, len($pgs) + 1) r(i)
UNION ALL
SELECT to_json({name: 'thread_sort_index', ph: 'M', ts: 0, pid: $rank, tid: $base + i, args: {sort_index: 100000 + i}})
FROM range(1, len($pgs) + 1) r(i)
"""

_FINDINGS_SQL = """
WITH placed AS (
    SELECT f.position, f.kind, f.pg_name, f.seq, f.culprit_ranks, f.detail,
           (SELECT min(c.start_ns) FROM run_fr_calls($run) c WHERE c.pg_name = f.pg_name AND c.seq = f.seq) AS ts_ns
    FROM findings f WHERE f.run_id = $run
    UNION ALL
    SELECT NULL, 'live_' || kind, pg_name, seq, culprit_ranks, detail, first_seen_ns - coalesce(
           (SELECT offset_ns FROM rank_offsets($run) WHERE rank = culprit_ranks[1]), 0)
    FROM live_findings WHERE run_id = $run
)
SELECT to_json({name: 'finding: ' || kind, cat: 'finding', ph: 'i', s: 'g',
                ts: round((coalesce(ts_ns, $last) - $t0) / 1000.0, 3), pid: $pid, tid: 0,
                args: {kind: kind, pg: pg_name, seq: seq, culprit_ranks: culprit_ranks, detail: detail}}) AS line
FROM placed WHERE coalesce(ts_ns, $last) >= $lo AND coalesce(ts_ns, $last) < $hi
"""


@dataclass
class TimelineResult:
    files: list[Path] = field(default_factory=list)
    events: int = 0
    #: Steps covered by each file, when the output was split by step range.
    step_ranges: list[tuple[int | None, int | None]] = field(default_factory=list)
    split: bool = False


@dataclass(frozen=True)
class _Part:
    lo: int
    hi: int
    first_step: int | None
    last_step: int | None
    events: int


def _parse_range(text: str | None, what: str) -> tuple[float, float] | None:
    if not text:
        return None
    try:
        a, b = text.split(":", 1)
        return float(a) if a else -math.inf, float(b) if b else math.inf
    except ValueError:
        raise BadInput(f"--{what} {text!r}: expected a:b") from None


def _part_path(output: Path, part: _Part, count: int) -> Path:
    if count == 1:
        return output
    name = output.name
    suffix = ".json.gz" if name.endswith(".json.gz") else (".json" if name.endswith(".json") else "")
    stem = name[: len(name) - len(suffix)] if suffix else name
    label = f"steps{part.first_step}-{part.last_step}" if part.first_step is not None else f"part{part.lo}"
    return output.with_name(f"{stem}.{label}{suffix or '.json'}")


def _plan(database, run_id: str, ranks: list[int], lo: int, hi: int, max_events: int) -> list[_Part]:
    """Cut [lo, hi) into parts of at most ``max_events`` events, at step boundaries when the run has
    steps (a step is never split), else at event-count quantiles. Events are counted by the step
    whose start they follow, the way the parts cut them: those before the first step start in range
    (a run's setup, its step 0 when no mark opened it) belong to the first part."""
    steps = database.fetchall("""
        WITH s AS (SELECT step, min(start_ns) AS start_ns FROM run_steps($1) WHERE list_contains($2, rank) GROUP BY step),
             e AS (SELECT ts_ns FROM aligned_events WHERE run_id = $1 AND list_contains($2, rank)
                   AND ts_ns >= $3 AND ts_ns < $4),
             n AS (SELECT s.step, count(*) AS events FROM e ASOF LEFT JOIN s ON e.ts_ns >= s.start_ns GROUP BY s.step)
        SELECT s.step, s.start_ns, coalesce(n.events, 0) FROM s LEFT JOIN n USING (step)
        WHERE s.start_ns >= $3 AND s.start_ns < $4 ORDER BY s.start_ns""", [run_id, ranks, lo, hi])
    total = database.fetchall("SELECT count(*) FROM aligned_events WHERE run_id = $1 AND list_contains($2, rank) "
                              "AND ts_ns >= $3 AND ts_ns < $4", [run_id, ranks, lo, hi])[0][0]
    if total <= max_events:
        return [_Part(lo, hi, steps[0][0] if steps else None, steps[-1][0] if steps else None, total)]
    parts: list[_Part] = []
    if steps:
        start, first, count = lo, steps[0][0], total - sum(events for _, _, events in steps)
        for index, (step, step_start, events) in enumerate(steps):
            if count and count + events > max_events:
                before_any_step = index == 0  # the setup alone fills a part
                parts.append(_Part(start, step_start, None if before_any_step else first,
                                   None if before_any_step else steps[index - 1][0], count))
                start, first, count = step_start, step, 0
            count += events
        parts.append(_Part(start, hi, first, steps[-1][0], count))
        return parts
    pieces = math.ceil(total / max_events)
    cuts = database.fetchall("SELECT quantile_disc(ts_ns, $5) FROM aligned_events WHERE run_id = $1 "
                             "AND list_contains($2, rank) AND ts_ns >= $3 AND ts_ns < $4",
                             [run_id, ranks, lo, hi, [i / pieces for i in range(1, pieces)]])[0][0]
    bounds = [lo, *cuts, hi]
    return [_Part(a, b, None, None, 0) for a, b in zip(bounds, bounds[1:]) if b > a]


def write_timeline(db_path: Path | Database, run_id: str, output: Path, *, ranks: list[int] | None = None,
                   steps: str | None = None, window: str | None = None, max_events: int = 2_000_000) -> TimelineResult:
    """Write ``run_id`` as Chrome trace JSON to ``output`` (``.json`` or ``.json.gz``).

    ``steps`` ("a:b") keeps steps a to b inclusive; ``window`` ("t0:t1") keeps seconds t0 to t1
    after the run's first event; ``ranks`` keeps those ranks. Past ``max_events`` trace events the
    output is split into several files by step range (a step is never split; the FR slices,
    findings and track names of a part come on top).
    """
    ensure_schema(db_path)
    with connect(db_path).held() as database:
        bounds = database.fetchall(  # each rank's extent on its own clock, then moved: no per-event arithmetic
            "SELECT min(first_ns - coalesce(o.offset_ns, 0)), max(last_ns - coalesce(o.offset_ns, 0)), "
            "list(rank ORDER BY rank) FROM (SELECT rank, min(ts_ns) AS first_ns, max(ts_ns + coalesce(dur_ns, 0)) "
            "AS last_ns FROM trace_events WHERE run_id = $1 GROUP BY rank) LEFT JOIN rank_offsets($1) o USING (rank)",
            [run_id])[0]
        if bounds[0] is None:
            raise BadInput(f"{db_path}: run {run_id!r} has no trace events")
        t0, last, all_ranks = bounds
        chosen = sorted(set(ranks) & set(all_ranks)) if ranks else all_ranks
        if not chosen:
            raise BadInput(f"--ranks: run {run_id!r} has ranks {all_ranks}, none of those asked for")
        lo, hi = t0, last + 1
        step_range = _parse_range(steps, "steps")
        if step_range:
            found = database.fetchall("SELECT min(start_ns), max(end_ns) FROM run_steps($1) WHERE step >= $2 AND step <= $3",
                                      [run_id, step_range[0], step_range[1]])[0]
            if found[0] is None:
                raise BadInput(f"--steps {steps}: run {run_id!r} has no such steps")
            lo, hi = found[0], found[1] + 1
        time_range = _parse_range(window, "window")
        if time_range:
            lo = max(lo, t0 + int(max(time_range[0], 0) * 1e9))
            hi = min(hi, t0 + int(min(time_range[1], 1e9) * 1e9))
        groups = database.fetchall("SELECT pg_name, any_value(pg_desc) FROM fr_entries WHERE run_id = $1 "
                                   "GROUP BY pg_name ORDER BY TRY_CAST(pg_name AS BIGINT), pg_name", [run_id])
        pgs, descs = [g[0] for g in groups], [g[1] for g in groups]  # track i (from 1) shows group pgs[i]
        offsets = dict(database.fetchall("SELECT rank, offset_ns FROM rank_offsets($1)", [run_id]))
        parts = _plan(database, run_id, chosen, lo, hi, max_events)
        result = TimelineResult(split=len(parts) > 1)
        output.parent.mkdir(parents=True, exist_ok=True)
        for part in parts:
            writer = ChromeTraceWriter(_part_path(output, part, len(parts)), t0, run_id)
            try:
                for lines in database.arrows(_part_queries(database, run_id, chosen, part, {
                        "t0": t0, "last": last, "pgs": pgs, "descs": descs, "offsets": offsets})):
                    writer.write_lines(lines)
            finally:
                writer.close()
            result.files.append(writer.path)
            result.events += writer.events
            result.step_ranges.append((part.first_step, part.last_step))
        return result


#: Events fetched per query: the writer holds two such slices at once (``Database.arrows``),
#: whatever the run's size.
SLICE_EVENTS = 100_000


def _part_queries(database, run_id: str, ranks: list[int], part: _Part, run: dict) -> Iterator[tuple[str, list]]:
    """The queries whose lines make up one file, in order: per rank its track names and its events a
    slice at a time, then the findings. ``run`` holds the run's t0, last, pgs, descs and offsets."""
    for rank in ranks:
        offset = run["offsets"].get(rank) or 0
        values = {"run": run_id, "rank": rank, "t0": run["t0"], "pgs": run["pgs"], "descs": run["descs"],
                  "base": COLLECTIVES_TID_BASE, "offset": offset}
        yield _lines(_METADATA_SQL, values)
        for lo, hi in _slices(database, run_id, rank, part.lo, part.hi, offset):
            yield _lines(_EVENTS_SQL, {**values, "lo": lo, "hi": hi, "own_lo": lo + offset, "own_hi": hi + offset})
    yield _lines(_FINDINGS_SQL, {"run": run_id, "lo": part.lo, "hi": part.hi, "t0": run["t0"], "last": run["last"],
                                 "pid": ranks[0]})  # global markers; pid only places them


def _lines(sql: str, values: dict) -> tuple[str, list]:
    """The query for ``sql``'s lines, each led by the writer's ``LINE_SEPARATOR`` (a comma and a
    newline) so that they can be written as one text."""
    return f"SELECT concat(',', chr(10), line) FROM ({sql})", bind(sql, values)


def _slices(database, run_id: str, rank: int, lo: int, hi: int, offset: int) -> list[tuple[int, int]]:
    """[lo, hi) cut so that each piece holds about ``SLICE_EVENTS`` of the rank's events (counted on
    the rank's own clock, ``offset`` ahead of the aligned one, so the scan is pruned by time too)."""
    own = [run_id, rank, lo + offset, hi + offset]
    count = database.fetchall("SELECT count(*) FROM trace_events WHERE run_id = $1 AND rank = $2 "
                              "AND ts_ns >= $3 AND ts_ns < $4", own)[0][0]
    if count <= SLICE_EVENTS:
        return [(lo, hi)]
    pieces = -(-count // SLICE_EVENTS)
    cuts = database.fetchall("SELECT list_distinct(quantile_disc(ts_ns, $5)) FROM trace_events WHERE run_id = $1 "
                             "AND rank = $2 AND ts_ns >= $3 AND ts_ns < $4",
                             [*own, [i / pieces for i in range(1, pieces)]])[0][0]
    bounds = [lo, *sorted(c - offset for c in cuts if lo < c - offset < hi), hi]
    return list(zip(bounds, bounds[1:]))
