"""Live hang and dead-rank detection, while the job is still running.

The signal is cheap and already on the bus: every heartbeat (one per second per rank) carries each
process group's last enqueued and completed collective, read from the Flight Recorder. For every
run that is still heartbeating, per group:

* the *head* is the highest collective any member has enqueued; when it has not moved for
  ``stall_s`` and some members are behind it, the group is hung: the members at the head wait in
  that collective (its op and creation time come from the FR entries), the members behind never
  reached it and are the culprits, each with its last enqueued/completed collective, its last
  heartbeat and its last published stack (``idle_outside_collectives`` or ``stalled_in_collective``);
* when every member reached the head but one of them has not completed it, the group is stuck in
  it: if the members' Flight Recorder entries for that sequence number name different ops (a rank
  that skipped a collective has moved on to its next one), the finding is ``mismatched_collective``
  and the ranks whose op differs from the majority's are the culprits (none on a tie); if they
  agree, it is ``stuck_collective`` with no culprit (the backend or the network);
* a rank whose heartbeats stopped for ``dead_s`` while its peers' continue is dead (reported
  separately, as ``dead_rank``).

``detect`` is a plain function over a DuckDB connection; ``HangWatch`` runs it every couple of
seconds on a thread of the materializer and replaces the run's rows in ``live_findings``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import duckdb

from rankstream.consumers.store import transaction

__all__ = ["LiveFinding", "detect", "HangWatch"]

_WINDOW_NS = 600 * 10**9

PROGRESS_SQL = """
WITH recent AS (
    SELECT run_id, rank, sent_ns, final, collectives FROM heartbeats WHERE sent_ns > $now - $window
), latest AS (
    SELECT * FROM recent QUALIFY row_number() OVER (PARTITION BY run_id, rank ORDER BY sent_ns DESC) = 1
), active AS (   -- still running: somebody heartbeated lately and not every rank said goodbye
    SELECT run_id FROM latest GROUP BY run_id HAVING max(sent_ns) > $now - $dead AND NOT bool_and(final)
), progress AS (
    SELECT r.run_id, r.rank, r.sent_ns, g.pg,
           json_extract(r.collectives, '$."' || g.pg || '".last_enqueued')::BIGINT AS enqueued,
           json_extract(r.collectives, '$."' || g.pg || '".last_completed')::BIGINT AS completed
    FROM recent r JOIN active USING (run_id),
         LATERAL (SELECT unnest(json_keys(r.collectives)) AS pg) g
    WHERE r.collectives IS NOT NULL
)
SELECT * FROM progress
"""


@dataclass
class LiveFinding:
    run_id: str
    kind: str
    pg_name: str | None
    seq: int | None
    op: str | None
    since_ns: int
    culprit_ranks: list[int]
    waiting_ranks: list[int]
    detail: dict


def _dead_ranks(con, now_ns: int, dead_ns: int) -> list[LiveFinding]:
    rows = con.sql("""
        WITH latest AS (
            SELECT * FROM heartbeats WHERE sent_ns > $now - $window
            QUALIFY row_number() OVER (PARTITION BY run_id, rank ORDER BY sent_ns DESC) = 1
        ), alive AS (
            SELECT run_id FROM latest GROUP BY run_id HAVING max(sent_ns) > $now - $dead
        )
        SELECT l.run_id, list(l.rank ORDER BY l.rank) AS ranks, min(l.sent_ns) AS since,
               (SELECT list(rank ORDER BY rank) FROM latest o WHERE o.run_id = l.run_id AND o.sent_ns > $now - $dead)
                   AS alive_ranks
        FROM latest l JOIN alive USING (run_id)
        WHERE l.sent_ns <= $now - $dead AND NOT l.final GROUP BY l.run_id
    """, params={"now": now_ns, "dead": dead_ns, "window": _WINDOW_NS}).fetchall()
    return [LiveFinding(run, "dead_rank", None, None, None, since, ranks, alive,
                        {"last_heartbeat_age_s": round((now_ns - since) / 1e9, 1)})
            for run, ranks, since, alive in rows]


def detect(con: duckdb.DuckDBPyConnection, now_ns: int | None = None, stall_s: float = 5.0,
           dead_s: float = 5.0) -> list[LiveFinding]:
    """Current hangs and dead ranks of the runs still heartbeating."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    stall_ns, dead_ns = int(stall_s * 1e9), int(dead_s * 1e9)
    con.execute(f"CREATE OR REPLACE TEMP TABLE _progress AS {PROGRESS_SQL}",
                {"now": now_ns, "dead": dead_ns, "window": _WINDOW_NS})
    dead = _dead_ranks(con, now_ns, dead_ns)
    dead_ranks = {(f.run_id, r) for f in dead for r in f.culprit_ranks}
    groups = con.sql("""
        WITH latest AS (
            SELECT * FROM _progress QUALIFY row_number() OVER (PARTITION BY run_id, rank, pg ORDER BY sent_ns DESC) = 1
        ), heads AS (
            SELECT run_id, pg, max(enqueued) AS head FROM latest GROUP BY ALL
        ), reached AS (   -- when the head was first reported: the group has not moved since
            SELECT p.run_id, p.pg, min(p.sent_ns) AS since FROM _progress p JOIN heads h USING (run_id, pg)
            WHERE p.enqueued = h.head GROUP BY ALL
        )
        SELECT h.run_id, h.pg, h.head, r.since,
               list(l.rank ORDER BY l.rank) FILTER (WHERE l.enqueued = h.head) AS waiting,
               coalesce(list(l.rank ORDER BY l.rank) FILTER (WHERE l.enqueued < h.head), []) AS behind
        FROM heads h JOIN reached r USING (run_id, pg) JOIN latest l USING (run_id, pg)
        WHERE r.since <= $now - $stall GROUP BY ALL
        -- somebody is behind the head, or somebody has not completed it (a group idle between
        -- collectives, every member done with the last one, is not hung)
        HAVING count(*) FILTER (WHERE l.enqueued < h.head OR coalesce(l.completed, h.head) < h.head) > 0
    """, params={"now": now_ns, "stall": stall_ns}).fetchall()
    findings = []
    for run_id, pg, head, since, waiting, behind in groups:
        entries = con.execute("SELECT rank, any_value(split_part(profiling_name, ':', 2)), min(time_created_ns) "
                              "FROM fr_entries WHERE run_id = ? AND pg_name = ? AND collective_seq_id = ? GROUP BY rank",
                              [run_id, pg, head]).fetchall()
        ops = {rank: op for rank, op, _ in entries}
        created = min((c for _, _, c in entries if c is not None), default=None)
        if behind:
            kind, culprits = "hang", [r for r in behind if (run_id, r) not in dead_ranks] or behind
            op = next((ops[r] for r in waiting if r in ops), None)
        else:
            kind, op, culprits, waiting = _at_the_head(ops, waiting)
        details = {str(rank): {**_rank_detail(con, run_id, rank, pg), **({"op": ops[rank]} if rank in ops else {})}
                   for rank in culprits}
        findings.append(LiveFinding(run_id, kind, pg, head, op, created or since, culprits, waiting, details))
    con.execute("DROP TABLE IF EXISTS _progress")
    return findings + dead


def _at_the_head(ops: dict[int, str], members: list[int]) -> tuple[str, str | None, list[int], list[int]]:
    """Every member reached the head and it is not done: (kind, op, culprits, waiting). The op most
    members issued is the one the group waits in; the ranks that issued another are the culprits,
    unless no op has a strict majority."""
    counts: dict[str, int] = {}
    for rank in members:
        if rank in ops:
            counts[ops[rank]] = counts.get(ops[rank], 0) + 1
    if len(counts) <= 1:
        return "stuck_collective", next(iter(counts), None), [], members
    op, votes = max(counts.items(), key=lambda item: item[1])
    if votes * 2 <= sum(counts.values()):
        return "mismatched_collective", None, [], members
    return ("mismatched_collective", op, [r for r in members if r in ops and ops[r] != op],
            [r for r in members if ops.get(r) == op])


def _rank_detail(con, run_id: str, rank: int, pg: str) -> dict:
    progress = con.execute("SELECT enqueued, completed, sent_ns FROM _progress WHERE run_id = ? AND rank = ? AND pg = ? "
                           "ORDER BY sent_ns DESC LIMIT 1", [run_id, rank, pg]).fetchone()
    stack = con.execute("SELECT args FROM trace_events WHERE run_id = ? AND rank = ? AND cat = 'rankstream' "
                        "AND name IN ('idle_outside_collectives', 'stalled_in_collective') ORDER BY ts_ns DESC LIMIT 1",
                        [run_id, rank]).fetchone()
    frames = json.loads(stack[0]).get("frames", [])[:8] if stack and stack[0] else []
    return {"last_enqueued": progress[0] if progress else None, "last_completed": progress[1] if progress else None,
            "last_heartbeat_ns": progress[2] if progress else None, "frames": frames}


class HangWatch:
    """Runs ``detect`` every ``interval_s`` on its own cursor and keeps ``live_findings`` current."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, interval_s: float = 2.0, stall_s: float = 5.0,
                 dead_s: float = 5.0) -> None:
        self._cursor = connection.cursor()
        self._interval, self._stall, self._dead = interval_s, stall_s, dead_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rankstream-hang-watch", daemon=True)
        self.passes = 0
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.check()
            except duckdb.Error as exc:  # a write conflict with the committer: try again next pass
                self.last_error = str(exc)

    def check(self) -> list[LiveFinding]:
        findings = detect(self._cursor, stall_s=self._stall, dead_s=self._dead)
        cursor = self._cursor
        with transaction(cursor):
            cursor.execute("DELETE FROM live_findings")
            for f in findings:
                cursor.execute("INSERT INTO live_findings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               [f.run_id, time.time_ns(), f.kind, f.pg_name, f.seq, f.op, f.since_ns,
                                f.culprit_ranks, f.waiting_ranks, json.dumps(f.detail)])
        self.passes += 1
        return findings
