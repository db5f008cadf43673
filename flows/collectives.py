"""Cross-rank collective matching: which collectives every member issued, and what went wrong.

Plain functions over a DuckDB connection (a Prefect flow wraps them). The matching is set-based
SQL: every rank's Flight Recorder entries for a group, keyed by ``collective_seq_id``, are joined
against the same sequence number on the other members, so the cost grows with the number of
entries, not with their square. The tables it (re)builds for a run:

* ``memberships``: (run_id, pg_name, rank) from the groups the ranks reported, or, where a backend
  does not list them (gloo), from the ranks that logged entries for the group, with the group's
  description, the first and last sequence number each rank logged, and the oldest one it logged
  but did not complete (NULL if none);
* ``collective_calls``: one row per rank's collective entry, with its op, sizes and dtypes (and their hashes);
* ``collectives``: one row per (group, sequence number) with the consensus op and who was there;
* ``findings``: what is wrong, each naming the group, the sequence number, the culprit ranks and
  the evidence (see ``FINDING_KINDS``).

Rules that differ from PyTorch's fr_trace, on purpose:

* the culprit is the rank that deviates from the group's consensus (the most common op at that
  sequence number), whatever order the dumps were listed in;
* a rank whose next entries line up with the group's sequence shifted by one has an extra or a
  skipped collective, reported as such, once, not as a cascade of type mismatches;
* sequence numbers older than a rank's oldest entry are outside its ring buffer: not compared, not
  a desync (a ``truncated_buffer`` note says so);
* a straggler (consistently late to create its collectives) is reported but is not a desync.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import duckdb

__all__ = ["Finding", "FINDING_KINDS", "build_collective_tables", "findings_for_run", "verdict"]

FINDING_KINDS = ("type_mismatch", "extra_collective", "skipped_collective", "size_mismatch", "dtype_mismatch",
                 "state_mismatch", "missing_rank", "hang", "straggler", "truncated_buffer", "dead_rank",
                 "p2p_mismatch")
#: Kinds that make a run a desync (as opposed to a hang, a straggler or a note).
DESYNC_KINDS = {"type_mismatch", "extra_collective", "skipped_collective", "size_mismatch", "dtype_mismatch",
                "state_mismatch", "missing_rank", "p2p_mismatch"}
_ORDER = {kind: i for i, kind in enumerate(FINDING_KINDS)}
#: A straggler is at least this late on average, and late in this share of its collectives.
STRAGGLER_MIN_NS = 2_000_000
STRAGGLER_SHARE = 0.8


@dataclass
class Finding:
    kind: str
    group: str
    group_desc: str | None
    seq: int | None
    culprit_ranks: list[int]
    ranks_involved: list[int]
    expected: Any = None
    actual: Any = None
    detail: str = ""
    evidence: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"kind": self.kind, "group": self.group, "group_desc": self.group_desc, "seq": self.seq,
                "culprit_ranks": self.culprit_ranks, "ranks_involved": self.ranks_involved,
                "expected": self.expected, "actual": self.actual, "detail": self.detail}


_OP = "split_part(split_part(profiling_name, ':', 2), ' ', 1)"
_COALESCED = "profiling_name LIKE '%coalesced%'"


def _calls_sql(latest_only: bool, coalesced: bool) -> str:
    """collective_calls: one row per rank's collective. A coalesced group (entries sharing one
    sequence number, closed by a ``coalesced`` entry) is one call whose op lists its members, e.g.
    ``coalesced(all_reduce,all_reduce)``, with the members' sizes and dtypes in order, so a rank
    that coalesced different ops or sizes disagrees with its peers like any other call.
    ``latest_only``: the live tap re-sends entries whose state changed; the newest state wins.
    ``coalesced``: whether there are any; without, each entry is a call (a third faster)."""
    latest = "QUALIFY row_number() OVER (PARTITION BY run_id, rank, record_id ORDER BY snapshot_ns DESC) = 1" \
        if latest_only else ""
    # the names of collectives (not send/recv) and their ops, worked out once per distinct name (a
    # handful) and joined back: string work on every entry took most of this statement's time
    ops = f"""ops AS MATERIALIZED (
    SELECT profiling_name, {_OP} AS op, {_COALESCED} AS marker
    FROM (SELECT DISTINCT profiling_name FROM fr_entries WHERE $run IS NULL OR run_id = $run)
    WHERE profiling_name NOT LIKE '%:send%' AND profiling_name NOT LIKE '%:recv%')"""
    entries = f"""
    SELECT run_id, rank, pg_name, pg_desc, collective_seq_id AS seq, record_id, ops.op,
           input_sizes, output_sizes, input_dtypes, state, time_created_ns AS created_ns,
           time_discovered_completed_ns AS completed_ns, frames{", ops.marker" if coalesced else ""}
    FROM fr_entries JOIN ops USING (profiling_name)
    WHERE coalesce(is_p2p, false) = false AND collective_seq_id > 0 AND ($run IS NULL OR run_id = $run)
    {latest}"""
    # hashes of the sizes and dtypes, computed once: the consensus and the size rules compare them
    hashed = "SELECT *, hash(input_sizes, output_sizes) AS sizes_hash, hash(input_dtypes) AS dtypes_hash FROM"
    if not coalesced:
        return f"CREATE OR REPLACE TABLE collective_calls AS WITH {ops}, entries AS ({entries}) {hashed} entries"
    return f"""
CREATE OR REPLACE TABLE collective_calls AS
WITH {ops}, entries AS ({entries}
), groups AS (
    SELECT DISTINCT run_id, rank, pg_name, seq FROM entries WHERE marker
), singles AS (
    SELECT e.* EXCLUDE (marker) FROM entries e ANTI JOIN groups g USING (run_id, rank, pg_name, seq)
), coalesced AS (
    SELECT run_id, rank, pg_name, any_value(pg_desc) AS pg_desc, seq, min(record_id) AS record_id,
           'coalesced(' || coalesce(string_agg(op, ',' ORDER BY record_id) FILTER (WHERE NOT marker), '') || ')' AS op,
           flatten(list(input_sizes ORDER BY record_id) FILTER (WHERE NOT marker)) AS input_sizes,
           flatten(list(output_sizes ORDER BY record_id) FILTER (WHERE NOT marker)) AS output_sizes,
           flatten(list(input_dtypes ORDER BY record_id) FILTER (WHERE NOT marker)) AS input_dtypes,
           arg_max(state, record_id) AS state, min(created_ns) AS created_ns, max(completed_ns) AS completed_ns,
           arg_min(frames, record_id) AS frames
    FROM entries e SEMI JOIN groups g USING (run_id, rank, pg_name, seq)
    GROUP BY run_id, rank, pg_name, seq
)
{hashed} (SELECT * FROM singles UNION ALL BY NAME SELECT * FROM coalesced)
"""


#: Whether any record was stored more than once (dumps hold each entry once, so picking the newest
#: state is not needed: several times faster), and whether the run coalesced any collectives.
#: Counting distinct hashes is several times faster than distinct tuples; a collision can only make
#: it answer yes, which takes the exact (slower) path.
REPEATS_SQL = f"""
SELECT count(*) > count(DISTINCT hash(run_id, rank, record_id)), coalesce(bool_or({_COALESCED}), false) FROM fr_entries
WHERE ($run IS NULL OR run_id = $run) AND collective_seq_id > 0 AND coalesce(is_p2p, false) = false
"""

MEMBERSHIPS_SQL = """
CREATE OR REPLACE TABLE memberships AS
WITH reached AS (  -- the one pass over the calls: how far each rank got in each group it logged
    SELECT run_id, pg_name, rank, any_value(pg_desc) AS pg_desc, min(seq) AS first_seq, max(seq) AS last_seq,
           min(seq) FILTER (WHERE state <> 'completed') AS first_unfinished_seq
    FROM collective_calls GROUP BY ALL
), listed AS (
    SELECT DISTINCT run_id, pg_name, unnest(ranks) AS rank FROM process_groups
    WHERE ranks IS NOT NULL AND len(ranks) > 0 AND ($run IS NULL OR run_id = $run)
), run_ranks AS (
    SELECT DISTINCT run_id, rank FROM reached
), defaults AS (  -- the default group holds every rank of the run, even when nobody listed it
    SELECT g.run_id, g.pg_name, r.rank
    FROM (SELECT DISTINCT run_id, pg_name FROM reached WHERE pg_desc = 'default_pg') g JOIN run_ranks r USING (run_id)
), inferred AS (
    SELECT run_id, pg_name, rank FROM reached
), members AS (
    SELECT * FROM listed
    UNION SELECT * FROM defaults WHERE (run_id, pg_name) NOT IN (SELECT run_id, pg_name FROM listed)
    UNION SELECT * FROM inferred WHERE (run_id, pg_name) NOT IN (SELECT run_id, pg_name FROM listed)
                                   AND (run_id, pg_name) NOT IN (SELECT run_id, pg_name FROM defaults)
), descs AS (
    SELECT run_id, pg_name, any_value(pg_desc) AS pg_desc FROM reached GROUP BY ALL
)
SELECT m.run_id, m.pg_name, d.pg_desc, m.rank, r.first_seq, r.last_seq, r.first_unfinished_seq
FROM members m LEFT JOIN reached r USING (run_id, pg_name, rank) LEFT JOIN descs d USING (run_id, pg_name)
"""

#: ``collectives``: the consensus op per (group, sequence number), whether the members' sizes or
#: dtypes differ at all (compared by hash, so that the size and dtype checks look only at the few
#: collectives where they do; a 64-bit collision could hide one difference, a 2^-64 chance), and
#: the sum and count of the members' creation times (the straggler check's means).
COLLECTIVES_SQL = """
CREATE OR REPLACE TABLE collectives AS
WITH votes AS (
    SELECT run_id, pg_name, seq, op, count(*) AS n,
           min(sizes_hash) AS sizes_low, max(sizes_hash) AS sizes_high,
           min(dtypes_hash) AS dtypes_low, max(dtypes_hash) AS dtypes_high,
           sum(created_ns) AS created_sum_ns, count(created_ns) AS created_count
    FROM collective_calls GROUP BY ALL
), consensus AS (
    SELECT run_id, pg_name, seq, arg_max(op, n) AS op, max(n) AS votes, sum(n) AS present,
           count(*) AS distinct_ops, min(sizes_low) <> max(sizes_high) AS sizes_differ,
           min(dtypes_low) <> max(dtypes_high) AS dtypes_differ, sum(created_sum_ns) AS created_sum_ns,
           sum(created_count) AS created_count
    FROM votes GROUP BY ALL
), group_sizes AS (
    SELECT run_id, pg_name, count(*) AS members FROM memberships GROUP BY ALL
)
SELECT c.run_id, c.pg_name, c.seq, c.op, c.votes, c.present, c.distinct_ops, c.sizes_differ, c.dtypes_differ,
       c.created_sum_ns, c.created_count, g.members
FROM consensus c JOIN group_sizes g USING (run_id, pg_name)
"""


def build_collective_tables(con: duckdb.DuckDBPyConnection, run_id: str | None = None, *,
                            repeats: bool | None = None, coalesced: bool | None = None) -> None:
    """(Re)build memberships, collective_calls and collectives for one run (or all runs).
    ``repeats``/``coalesced``: whether records repeat and whether any collectives were coalesced,
    when the caller knows (a dump loader does); otherwise the entries are scanned to find out."""
    params = {"run": run_id}
    if repeats is None or coalesced is None:
        repeats, coalesced = con.execute(REPEATS_SQL, params).fetchone()
    con.execute(_calls_sql(latest_only=repeats, coalesced=coalesced), params)
    con.execute(MEMBERSHIPS_SQL, params)
    con.execute(COLLECTIVES_SQL)


def _rows(con, sql: str, params: list | dict | None = None) -> list[dict]:
    return con.sql(sql, params=params or None).to_arrow_table().to_pylist()


def _group_descs(con, run_id: str) -> dict[str, str | None]:
    return {r["pg_name"]: r["pg_desc"] for r in _rows(
        con, "SELECT pg_name, any_value(pg_desc) AS pg_desc FROM memberships WHERE run_id = ? GROUP BY ALL",
        [run_id])}


#: How many following collectives decide whether a rank is shifted by one (extra or skipped).
_ALIGNMENT_WINDOW = 8


def _type_findings(con, run_id: str, descs) -> tuple[list[Finding], dict[tuple[str, int], int]]:
    """First op deviation per (group, rank), classified as extra, skipped or a type mismatch.

    A rank that skipped one collective lines up with the group shifted by +1 afterwards; one with an
    extra collective, shifted by -1. Both readings are scored over the next few collectives, since
    a training loop repeats its ops and a single comparison can fit either.
    """
    deviations = _rows(con, f"""
        WITH dev AS (
            SELECT k.pg_name, k.rank, k.seq, k.op AS actual, c.op AS expected,
                   row_number() OVER (PARTITION BY k.pg_name, k.rank ORDER BY k.seq) AS nth
            FROM collective_calls k JOIN collectives c USING (run_id, pg_name, seq)
            WHERE k.run_id = $run AND c.distinct_ops > 1 AND k.op <> c.op AND c.votes * 2 > c.present
        ), firsts AS (SELECT * FROM dev WHERE nth = 1), offsets AS (SELECT range AS k FROM range({_ALIGNMENT_WINDOW})),
        own_calls AS (  -- only the deviating ranks' calls and their groups' collectives are looked at below
            SELECT k.pg_name, k.rank, k.seq, k.op FROM collective_calls k SEMI JOIN firsts f USING (pg_name, rank)
            WHERE k.run_id = $run
        ), group_ops AS (
            SELECT c.pg_name, c.seq, c.op FROM collectives c SEMI JOIN firsts f USING (pg_name) WHERE c.run_id = $run
        )
        SELECT f.pg_name, f.rank, f.seq, f.actual, f.expected,
               count(*) FILTER (WHERE own.op = grp_next.op) AS skipped_score,
               count(*) FILTER (WHERE own_next.op = grp.op) AS extra_score,
               (SELECT last_seq FROM memberships m WHERE m.run_id = $run AND m.pg_name = f.pg_name
                  AND m.rank = f.rank) - (SELECT median(last_seq) FROM memberships m
                  WHERE m.run_id = $run AND m.pg_name = f.pg_name AND m.rank <> f.rank) AS lead
        FROM firsts f CROSS JOIN offsets o
        LEFT JOIN own_calls own ON own.pg_name = f.pg_name AND own.rank = f.rank AND own.seq = f.seq + o.k
        LEFT JOIN own_calls own_next ON own_next.pg_name = f.pg_name AND own_next.rank = f.rank
             AND own_next.seq = f.seq + o.k + 1
        LEFT JOIN group_ops grp ON grp.pg_name = f.pg_name AND grp.seq = f.seq + o.k
        LEFT JOIN group_ops grp_next ON grp_next.pg_name = f.pg_name AND grp_next.seq = f.seq + o.k + 1
        GROUP BY ALL ORDER BY f.seq, f.rank
    """, {"run": run_id})
    findings, derailed = [], {}
    for d in deviations:
        derailed[(d["pg_name"], d["rank"])] = d["seq"]
        skipped, extra = d["skipped_score"], d["extra_score"]
        if skipped == extra and skipped >= 2 and d["lead"]:  # a repeating pattern fits both shifts: a rank
            skipped, extra = (skipped + 1, extra) if d["lead"] < 0 else (skipped, extra + 1)  # ends short if it skipped
        if skipped > extra and skipped >= 2:
            kind, detail = "skipped_collective", (f"rank {d['rank']} skipped the group's {d['expected']} and went "
                                                  f"on to {d['actual']}; its later collectives are shifted by one")
        elif extra > skipped and extra >= 2:
            kind, detail = "extra_collective", (f"rank {d['rank']} issued an extra {d['actual']} the group did not; "
                                                f"its later collectives are shifted by one")
        else:
            kind, detail = "type_mismatch", (f"rank {d['rank']} issued {d['actual']} where the group issued "
                                             f"{d['expected']}")
        findings.append(Finding(kind, d["pg_name"], descs.get(d["pg_name"]), d["seq"], [d["rank"]], [d["rank"]],
                                d["expected"], d["actual"], detail,
                                {"skipped_score": skipped, "extra_score": extra}))
    _add_involved(con, run_id, findings)
    return findings, derailed


def _derailed_table(con, derailed: dict[tuple[str, int], int]) -> None:
    """``_derailed(pg_name, rank, seq)``: where each derailed rank left the group's sequence."""
    import pyarrow as pa

    con.register("_derailed", pa.table({
        "pg_name": pa.array([g for g, _ in derailed], pa.string()),
        "rank": pa.array([r for _, r in derailed], pa.int32()),
        "seq": pa.array(list(derailed.values()), pa.int64()),
    }))


def _add_involved(con, run_id: str, findings: list[Finding]) -> None:
    for finding in findings:
        finding.ranks_involved = [r for (r,) in con.execute(
            "SELECT rank FROM memberships WHERE run_id = ? AND pg_name = ? ORDER BY rank",
            [run_id, finding.group]).fetchall()] or finding.culprit_ranks


def _expands(shape_out: list[int], shape_in: list[int], factor: int) -> bool:
    """``shape_out`` is ``shape_in`` gathered from ``factor`` ranks: one dimension ``factor`` times
    larger (a flat all-gather), or a new leading dimension of ``factor`` (a list of outputs)."""
    if len(shape_out) == len(shape_in) + 1:
        return shape_out[0] == factor and shape_out[1:] == shape_in
    if len(shape_out) != len(shape_in):
        return False
    ratios = [a / b if b else (1 if a == b else math.inf) for a, b in zip(shape_out, shape_in)]
    off = [r for r in ratios if r != 1]
    return not off or (len(off) == 1 and off[0] == factor)


_ALL_GATHERS = ("all_gather", "_all_gather_base", "_allgather_base", "all_gather_into_tensor", "allgather",
                "all_gather_single")
_REDUCE_SCATTERS = ("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor", "reducescatter",
                    "reduce_scatter_single")
_ALL_TO_ALLS = ("alltoall", "alltoall_base", "all_to_all", "all_to_all_single")
#: Ops whose members may legitimately send different sizes or dtypes (or none): an all-to-all's
#: splits may be uneven (its check is the totals, below), a scatter's or gather's root differs.
_UNEVEN = _ALL_TO_ALLS + ("scatter", "gather", "barrier")


def _sql_names(names: tuple[str, ...]) -> str:
    """Op names as the inside of a SQL ``IN (...)`` (constants of this module, never user input)."""
    return ", ".join(f"'{name}'" for name in names)


def _sizes_ok(op: str, inputs: str, outputs: str, members: int) -> bool:
    """Per-call syntax: an all-gather's output is its input times the group size in one dimension."""
    try:
        first_in, first_out = json.loads(inputs or "[]"), json.loads(outputs or "[]")
    except ValueError:
        return True
    if not first_in or not first_out:
        return True
    if op in _ALL_GATHERS:
        return _expands(first_out[0], first_in[0], members) or len(first_out) == members
    if op in _REDUCE_SCATTERS:
        return _expands(first_in[0], first_out[0], members) or len(first_in) == members
    return True


def _size_findings(con, run_id: str, descs, derailed, issued: set[str]) -> list[Finding]:
    """``issued``: the ops of the run's collectives; a rule about ops the run never issued is not run."""
    findings = []
    # 1. ranks whose sizes or dtypes differ from the most common ones at the same collective
    for column, kind, differ in (("[input_sizes, output_sizes]", "size_mismatch", "sizes_differ"),
                                 ("input_dtypes", "dtype_mismatch", "dtypes_differ")):
        rows = _rows(con, f"""
            WITH calls AS (
                SELECT k.*, {column} AS value FROM collective_calls k JOIN collectives c USING (run_id, pg_name, seq)
                WHERE k.run_id = ? AND c.{differ} AND k.op = c.op AND k.op NOT IN ({_sql_names(_UNEVEN)})
            ), votes AS (
                SELECT pg_name, seq, value, count(*) AS n FROM calls GROUP BY ALL
            ), consensus AS (
                SELECT pg_name, seq, arg_max(value, n) AS value, max(n) AS n, sum(n) AS present
                FROM votes GROUP BY ALL HAVING count(*) > 1
            )
            SELECT k.pg_name, k.seq, k.rank, k.value::VARCHAR AS actual, c.value::VARCHAR AS expected,
                   c.n * 2 > c.present AS clear
            FROM calls k JOIN consensus c USING (pg_name, seq) WHERE k.value <> c.value
            ORDER BY k.seq, k.rank
        """, [run_id])
        by_collective: dict[tuple, list[dict]] = {}
        for row in rows:
            if (row["pg_name"], row["rank"]) not in derailed:
                by_collective.setdefault((row["pg_name"], row["seq"]), []).append(row)
        for (group, seq), deviants in by_collective.items():
            culprits = sorted(r["rank"] for r in deviants) if deviants[0]["clear"] else []
            findings.append(Finding(kind, group, descs.get(group), seq, culprits, [],
                                    deviants[0]["expected"], {r["rank"]: r["actual"] for r in deviants},
                                    f"{len(deviants)} rank(s) disagree with the group on "
                                    f"{'tensor sizes' if kind == 'size_mismatch' else 'dtypes'}"))
    # 2. per-call syntax rules, checked once per distinct (op, sizes, group size)
    #    (distinct by hash, so that millions of calls are not turned into text to find a few combinations)
    sized_calls = f"""
        WITH group_sizes AS (SELECT pg_name, count(*) AS members FROM memberships WHERE run_id = $run GROUP BY ALL)
        SELECT k.*, g.members
        FROM collective_calls k JOIN group_sizes g USING (pg_name)
        WHERE k.run_id = $run AND k.op IN ({_sql_names(_ALL_GATHERS + _REDUCE_SCATTERS)})
    """
    combos = [] if issued.isdisjoint(_ALL_GATHERS + _REDUCE_SCATTERS) else _rows(con, f"""
        SELECT op, members, sizes_hash, any_value(input_sizes)::VARCHAR AS input_sizes,
               any_value(output_sizes)::VARCHAR AS output_sizes
        FROM ({sized_calls}) GROUP BY op, members, sizes_hash
    """, {"run": run_id})
    bad = [c for c in combos if not _sizes_ok(c["op"], c["input_sizes"], c["output_sizes"], c["members"])]
    for combo in bad:
        rows = _rows(con, f"""
            SELECT pg_name, seq, list(rank ORDER BY rank) AS ranks FROM ({sized_calls})
            WHERE op = $op AND sizes_hash = $hash AND members = $members GROUP BY ALL ORDER BY seq LIMIT 1
        """, {"run": run_id, "op": combo["op"], "hash": combo["sizes_hash"], "members": combo["members"]})
        for row in rows:
            findings.append(Finding("size_mismatch", row["pg_name"], descs.get(row["pg_name"]), row["seq"],
                                    row["ranks"], [], f"{combo['op']} output = input x {combo['members']} ranks",
                                    f"{combo['input_sizes']} -> {combo['output_sizes']}",
                                    f"{combo['op']} sizes break the expansion rule for a group of {combo['members']}"))
    # 3. all-to-all: the total elements sent must equal the total received
    totals = [] if issued.isdisjoint(_ALL_TO_ALLS) else _rows(con, f"""
        SELECT pg_name, seq, list(rank ORDER BY rank) AS ranks,
               sum(list_sum(list_transform(input_sizes, lambda s: list_product(s)))) AS sent,
               sum(list_sum(list_transform(output_sizes, lambda s: list_product(s)))) AS received
        FROM collective_calls WHERE run_id = ? AND op IN ({_sql_names(_ALL_TO_ALLS)}) AND len(input_sizes) > 0
        GROUP BY ALL HAVING sent <> received ORDER BY seq
    """, [run_id])
    for row in totals:
        findings.append(Finding("size_mismatch", row["pg_name"], descs.get(row["pg_name"]), row["seq"], [],
                                row["ranks"], row["sent"], row["received"],
                                "all-to-all: elements sent by all ranks differ from elements received"))
    _add_involved(con, run_id, findings)
    return findings


def _tail_findings(con, run_id: str, descs, derailed) -> list[Finding]:
    """Members that never reached a collective their peers are in: a hang (at the group's last
    collective) or a missing rank (earlier: the rank is behind but the group went on)."""
    _derailed_table(con, derailed)
    rows = _rows(con, """
        WITH reached AS (   -- ranks that left the group's sequence are reported already; not here
            SELECT m.pg_name, m.rank, m.last_seq, m.first_seq FROM memberships m
            WHERE m.run_id = $run AND (m.pg_name, m.rank) NOT IN (SELECT pg_name, rank FROM _derailed)
        ), heads AS (
            SELECT pg_name, max(last_seq) AS head FROM reached GROUP BY ALL
        ), behind AS (
            SELECT r.pg_name, r.rank, r.last_seq, h.head FROM reached r JOIN heads h USING (pg_name)
            WHERE r.last_seq IS NULL OR r.last_seq < h.head
        ), waiting AS (  -- joins keyed by the few ranks behind, not lookups per row
            SELECT k.pg_name, list(k.rank ORDER BY k.rank) AS waiting
            FROM collective_calls k JOIN (SELECT DISTINCT pg_name, head FROM behind) h
              ON k.pg_name = h.pg_name AND k.seq = h.head
            WHERE k.run_id = $run GROUP BY ALL
        )
        SELECT b.pg_name, b.rank, b.last_seq, b.head, c.op AS head_op, l.op AS last_op, w.waiting
        FROM behind b
        LEFT JOIN collectives c ON c.run_id = $run AND c.pg_name = b.pg_name AND c.seq = b.head
        LEFT JOIN collective_calls l ON l.run_id = $run AND l.pg_name = b.pg_name AND l.rank = b.rank
             AND l.seq = b.last_seq
        LEFT JOIN waiting w ON w.pg_name = b.pg_name
        ORDER BY b.pg_name, b.last_seq NULLS FIRST, b.rank
    """, {"run": run_id})
    con.unregister("_derailed")
    by_group: dict[str, list[dict]] = {}
    for row in rows:
        by_group.setdefault(row["pg_name"], []).append(row)
    findings = []
    for group, behind in by_group.items():
        head = behind[0]["head"]
        first_missing = min((r["last_seq"] or 0) + 1 for r in behind)
        culprits = sorted(r["rank"] for r in behind)
        last = {r["rank"]: {"last_seq": r["last_seq"], "last_op": r["last_op"]} for r in behind}
        kind = "hang" if first_missing == head else "missing_rank"
        detail = (f"ranks {behind[0]['waiting']} are in {behind[0]['head_op']} #{head}; ranks {culprits} never reached "
                  f"it (their last: {last})")
        findings.append(Finding(kind, group, descs.get(group), first_missing if kind == "missing_rank" else head,
                                culprits, sorted(set(behind[0]["waiting"] or []) | set(culprits)),
                                behind[0]["head_op"], last, detail))
    return findings


def _truncation_findings(con, run_id: str, descs) -> list[Finding]:
    rows = _rows(con, """
        SELECT pg_name, list(rank ORDER BY rank) AS ranks, min(first_seq) AS earliest, max(first_seq) AS latest
        FROM (SELECT pg_name, rank, first_seq FROM memberships WHERE run_id = ? AND first_seq IS NOT NULL)
        WHERE first_seq > 1 GROUP BY ALL ORDER BY pg_name
    """, [run_id])
    return [Finding("truncated_buffer", r["pg_name"], descs.get(r["pg_name"]), r["latest"], [], r["ranks"],
                    None, None, f"ring buffers of ranks {r['ranks']} no longer hold the group's first collectives "
                                f"(oldest kept: #{r['earliest']}..#{r['latest']}); older ones are not compared")
            for r in rows]


def _straggler_findings(con, run_id: str, descs, derailed) -> list[Finding]:
    """Ranks consistently late to create their collectives (only where the group is still aligned).

    Lateness is measured against the mean creation time of the other members and averaged per rank
    over all its groups: a rank that waits for a slow peer in a small group looks late in the larger
    groups too, but it is early in the group it shares with the slow peer, which cancels it out.
    """
    _derailed_table(con, derailed)
    rows = _rows(con, f"""
        WITH complete AS (
            SELECT run_id, pg_name, seq, created_sum_ns, created_count FROM collectives c
            WHERE run_id = ? AND present = members AND members > 1 AND created_count > 1
              AND seq < coalesce((SELECT min(d.seq) FROM _derailed d WHERE d.pg_name = c.pg_name), seq + 1)
        ), lateness AS (  -- against the mean of the other members, so a lone straggler's lag is measured in full
            SELECT k.pg_name, k.rank, k.created_ns - (c.created_sum_ns - k.created_ns) / (c.created_count - 1) AS late
            FROM collective_calls k JOIN complete c USING (run_id, pg_name, seq) WHERE k.created_ns IS NOT NULL
        ), per_group AS (
            SELECT rank, pg_name, sum(late) AS late_sum, count(*) AS n, count(*) FILTER (WHERE late > 0) AS late_n
            FROM lateness GROUP BY ALL
        )
        SELECT rank, (sum(late_sum) / sum(n))::BIGINT AS mean_late_ns, sum(late_n) / sum(n) AS late_share,
               sum(n) AS n, arg_max(pg_name, late_sum / n) AS worst_group
        FROM per_group GROUP BY rank
        HAVING sum(n) >= 10 AND sum(late_sum) / sum(n) > {STRAGGLER_MIN_NS}
           AND sum(late_n) / sum(n) >= {STRAGGLER_SHARE}
        ORDER BY mean_late_ns DESC
    """, [run_id])
    con.unregister("_derailed")
    findings = [Finding("straggler", r["worst_group"], descs.get(r["worst_group"]), None, [r["rank"]], [], None,
                        {"mean_late_ms": round(r["mean_late_ns"] / 1e6, 2), "late_share": round(r["late_share"], 2)},
                        f"rank {r['rank']} creates its collectives {r['mean_late_ns'] / 1e6:.1f} ms after the mean of "
                        f"its peers on average, late in {r['late_share']:.0%} of {r['n']} (most in group "
                        f"{r['worst_group']})")
                for r in rows]
    _add_involved(con, run_id, findings)
    return findings


P2P_SQL = f"""
WITH ops AS (   -- 'nccl:send 0->1' / 'nccl:recv 1<-0', group-local ranks, mapped to global ones
    SELECT e.rank, e.pg_name, e.pg_desc, e.record_id, e.input_sizes, e.output_sizes,
           {_OP} AS op,
           regexp_extract(e.profiling_name, '(\\d+)\\s*(->|<-)\\s*(\\d+)', ['a', 'arrow', 'b']) AS m
    FROM fr_entries e
    WHERE e.run_id = $run AND (e.profiling_name LIKE '%:send %' OR e.profiling_name LIKE '%:recv %')
), members AS (
    SELECT pg_name, rank, row_number() OVER (PARTITION BY pg_name ORDER BY rank) - 1 AS local_rank
    FROM memberships WHERE run_id = $run
), located AS (
    SELECT o.*, CASE WHEN o.op = 'send' THEN m.a::INT ELSE m.b::INT END AS src_local,
           CASE WHEN o.op = 'send' THEN m.b::INT ELSE m.a::INT END AS dst_local
    FROM ops o
), global AS (
    SELECT l.rank, l.pg_name, l.pg_desc, l.record_id, l.op, l.input_sizes, l.output_sizes,
           coalesce(s.rank, l.src_local) AS src, coalesce(d.rank, l.dst_local) AS dst
    FROM located l
    LEFT JOIN members s ON s.pg_name = l.pg_name AND s.local_rank = l.src_local
    LEFT JOIN members d ON d.pg_name = l.pg_name AND d.local_rank = l.dst_local
), numbered AS (
    SELECT *, row_number() OVER (PARTITION BY rank, pg_name, op, src, dst ORDER BY record_id) AS nth FROM global
), starts AS (  -- a rank whose ring buffer no longer starts at record 0 may have lost old p2p entries
    SELECT rank, min(record_id) > 0 AS truncated FROM fr_entries WHERE run_id = $run GROUP BY rank
)
SELECT s.pg_name, s.pg_desc, s.src, s.dst, s.nth, s.input_sizes::VARCHAR AS sent, r.output_sizes::VARCHAR AS received,
       r.rank IS NULL AS unmatched
FROM numbered s
LEFT JOIN numbered r ON r.op = 'recv' AND r.rank = s.dst AND r.pg_name = s.pg_name AND r.src = s.src
     AND r.dst = s.dst AND r.nth = s.nth
LEFT JOIN starts t ON t.rank = s.dst
WHERE s.op = 'send' AND s.rank = s.src
  AND ((r.rank IS NOT NULL AND s.input_sizes IS DISTINCT FROM r.output_sizes)
       OR (r.rank IS NULL AND s.dst IN (SELECT rank FROM fr_entries WHERE run_id = $run)
           AND NOT coalesce(t.truncated, false)))
ORDER BY s.pg_name, s.src, s.dst, s.nth
"""


def _p2p_findings(con, run_id: str) -> list[Finding]:
    """The k-th send from A to B pairs with the k-th recv on B from A, whatever else is batched in
    between; a pair whose sizes differ, or a send with no receive where B's buffer would hold it, is
    a p2p mismatch (one finding per pair of ranks, the first one). The run's distinct entry names
    (a handful) say first whether there are any sends or receives at all."""
    names = con.execute("SELECT DISTINCT profiling_name FROM fr_entries WHERE run_id = ?", [run_id]).fetchall()
    if not any(":send " in name or ":recv " in name for (name,) in names):  # as P2P_SQL's LIKE patterns
        return []
    findings, seen = [], set()
    for row in _rows(con, P2P_SQL, {"run": run_id}):
        key = (row["pg_name"], row["src"], row["dst"])
        if key in seen:
            continue
        seen.add(key)
        if row["unmatched"]:
            detail = f"send #{row['nth']} from rank {row['src']} to rank {row['dst']} has no matching recv on rank {row['dst']}"
            culprits = [row["dst"]]
        else:
            detail = (f"send #{row['nth']} from rank {row['src']} to rank {row['dst']}: sent {row['sent']}, "
                      f"received {row['received']}")
            culprits = []
        findings.append(Finding("p2p_mismatch", row["pg_name"], row["pg_desc"], None, culprits,
                                [row["src"], row["dst"]], row["sent"], row["received"], detail))
    return findings


STATE_SQL = """
WITH reach AS (  -- each rank's newest collective in each group where a rank left one unfinished behind
    SELECT rank, pg_name, last_seq AS newest FROM memberships WHERE run_id = $run AND pg_name IN
        (SELECT pg_name FROM memberships WHERE run_id = $run AND first_unfinished_seq < last_seq)
), calls AS (
    SELECT k.pg_name, k.seq, k.rank, k.state, k.state <> 'completed' AND r.newest > k.seq AS moved_on
    FROM collective_calls k JOIN reach r USING (rank, pg_name) WHERE k.run_id = $run
), firsts AS (  -- cheap flags over every call first; lists and maps only for the first such collective
    SELECT pg_name, min(seq) AS seq
    FROM (SELECT pg_name, seq FROM calls GROUP BY ALL HAVING bool_or(state = 'completed') AND bool_or(moved_on))
    GROUP BY pg_name
)
SELECT pg_name, seq, list(rank ORDER BY rank) FILTER (WHERE moved_on) AS moved_on,
       map_from_entries(list((rank, state) ORDER BY rank))::VARCHAR AS states
FROM calls SEMI JOIN firsts USING (pg_name, seq) GROUP BY ALL ORDER BY seq
"""


def _state_findings(con, run_id: str, descs, derailed) -> list[Finding]:
    """A collective some members completed while others, though they went on to later collectives
    of the group, never completed it. (At a group's newest collective a difference in state is just
    progress, reported as a hang if it lasts; gloo entries stay 'scheduled' and never trip this.)
    Reported once per group, at the first such collective."""
    findings = []
    for row in _rows(con, STATE_SQL, {"run": run_id}):
        culprits = [r for r in row["moved_on"] if (row["pg_name"], r) not in derailed]
        if culprits:
            findings.append(Finding("state_mismatch", row["pg_name"], descs.get(row["pg_name"]), row["seq"], culprits,
                                    [], "completed", row["states"],
                                    f"rank(s) {culprits} went on to later collectives of the group without completing "
                                    f"this one, which their peers completed"))
    _add_involved(con, run_id, findings)
    return findings


def findings_for_run(con: duckdb.DuckDBPyConnection, run_id: str, mismatch_cap: int | None = None) -> list[Finding]:
    """Findings of one run (tables built by ``build_collective_tables``), first mismatch first."""
    descs = _group_descs(con, run_id)
    issued = {op for (op,) in con.execute("SELECT DISTINCT op FROM collectives WHERE run_id = ?", [run_id]).fetchall()}
    type_findings, derailed = _type_findings(con, run_id, descs)
    findings = (type_findings + _size_findings(con, run_id, descs, derailed, issued)
                + _state_findings(con, run_id, descs, derailed) + _tail_findings(con, run_id, descs, derailed)
                + _truncation_findings(con, run_id, descs)
                + _straggler_findings(con, run_id, descs, derailed) + _p2p_findings(con, run_id))
    findings.sort(key=lambda f: (f.kind not in DESYNC_KINDS and f.kind != "hang", f.seq is None,
                                 f.seq if f.seq is not None else 0, _ORDER[f.kind], f.group))
    if mismatch_cap is not None:
        capped, count = [], 0
        for finding in findings:
            if finding.kind in DESYNC_KINDS:
                count += 1
                if count > mismatch_cap:
                    continue
            capped.append(finding)
        findings = capped
    return findings


def verdict(findings: list[Finding], incomplete: bool = False) -> str:
    kinds = {f.kind for f in findings}
    if kinds & DESYNC_KINDS:
        return "desync"
    if "hang" in kinds or "dead_rank" in kinds:
        return "hang"
    if incomplete:
        return "incomplete"
    if "straggler" in kinds:
        return "straggler"
    return "healthy"


def findings_rows(run_id: str, findings: list[Finding]) -> list[dict]:
    """The ``findings`` table's rows for a run, in reporting order."""
    return [{"run_id": run_id, "position": position, "kind": f.kind, "pg_name": f.group, "pg_desc": f.group_desc,
             "seq": f.seq, "culprit_ranks": f.culprit_ranks, "ranks_involved": f.ranks_involved,
             "expected": json.dumps(f.expected, default=str), "actual": json.dumps(f.actual, default=str),
             "detail": f.detail} for position, f in enumerate(findings)]


#: Inserts ``findings_rows`` sent as one JSON parameter (through the query server, which takes SQL only).
INSERT_FINDINGS_JSON_SQL = """
INSERT INTO findings BY NAME
SELECT unnest(from_json($rows, '[{"run_id": "VARCHAR", "position": "INTEGER", "kind": "VARCHAR",
    "pg_name": "VARCHAR", "pg_desc": "VARCHAR", "seq": "BIGINT", "culprit_ranks": "INTEGER[]",
    "ranks_involved": "INTEGER[]", "expected": "VARCHAR", "actual": "VARCHAR", "detail": "VARCHAR"}]'), recursive := true)
"""


def store_findings(con: duckdb.DuckDBPyConnection, run_id: str, findings: list[Finding]) -> None:
    """Replace a run's rows in the ``findings`` table."""
    con.execute("DELETE FROM findings WHERE run_id = ?", [run_id])
    if findings:
        con.execute(INSERT_FINDINGS_JSON_SQL, {"rows": json.dumps(findings_rows(run_id, findings))})
