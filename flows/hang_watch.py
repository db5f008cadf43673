"""The live hang watch: the collective diagnosis, run on live data every couple of seconds.

For every run still heartbeating it runs the same engine as ``rankstream diagnose``
(``flows.diagnosis``) on the run's stored Flight Recorder entries, with the ranks whose heartbeats
stopped named as dead. Each finding becomes an *episode* in ``live_findings``: first seen, last
seen, and cleared when a later pass no longer finds it. Episodes are never deleted, so a 40 s stall
that cleared is still there for ``report`` and ``analyze collectives``.

What a rank's Flight Recorder snapshot shows can lag its heartbeats by seconds (the tap dumps the
ring every few seconds), so a finding about ranks waiting is only recorded once none of the ranks
involved has made progress for ``stall_s`` (their heartbeats carry each group's last collective);
a disagreement about sizes or types of a completed collective is a fact at once.

Heartbeats and Flight Recorder entries travel on different topics, so a rank's heartbeat can say it
enqueued a collective whose entry is not stored yet. Judged on that partial view, the engine would
blame the wrong rank (the one whose last call is missing). So a pass records nothing for a run while
a rank that stopped moving still has entries in flight: its view is complete a tick later. A rank
whose entries never arrive (its tap gave up while the broker was down) holds the run back for at
most ``3 × stall_s``; then what is stored is judged.
"""

from __future__ import annotations

import json
import threading
import time

import duckdb

from rankstream.consumers.query import Database
from rankstream.consumers.store import transaction
from rankstream.flows.diagnosis.findings import WAIT_KINDS, Finding
from rankstream.flows.diagnosis.blocked_transfers import blocked_transfer_findings
from rankstream.flows.diagnosis.published_stacks import STACK_SQL, current_places, stacks_published_ns
from rankstream.flows.diagnosis.report import diagnose_stored
from rankstream.flows.diagnosis.ring_progress import ring_progress

__all__ = ["HangWatch", "watch_pass", "ACTIVE_RUNS_SQL"]

_WINDOW_NS = 600 * 10**9
#: Each pass judges every rank's last records: what changed since the previous passes, with enough
#: history before it for the evidence (a group's period, a rank's shifted stretch).
TAIL_RECORDS = 400

#: Runs still going, or that ended without every rank saying goodbye (a rank killed, its peers
#: failing at once), or that ended cleanly in the last ``$grace`` ns (their last entries may still be
#: arriving), with each rank's last heartbeat and when its progress last changed: its collectives,
#: or its count of transfers (gloo records none in the Flight Recorder, ``producers.transfer_count``).
ACTIVE_RUNS_SQL = """
WITH recent AS (
    SELECT run_id, rank, sent_ns, final,
           coalesce(collectives, '') || '|' || coalesce(transfers, 0)::VARCHAR AS progress FROM heartbeats
    WHERE sent_ns > $now - $window
), changes AS (
    SELECT *, progress IS DISTINCT FROM lag(progress) OVER (PARTITION BY run_id, rank ORDER BY sent_ns) AS changed
    FROM recent
), ranks AS (
    SELECT run_id, rank, max(sent_ns) AS last_ns, bool_or(final) AS final,
           max(sent_ns) FILTER (WHERE changed) AS progressed_ns
    FROM changes GROUP BY ALL
)
SELECT run_id, list(rank ORDER BY rank) AS ranks, list(last_ns ORDER BY rank) AS last_ns,
       list(final ORDER BY rank) AS final, list(progressed_ns ORDER BY rank) AS progressed_ns,
       bool_and(final) AS ended
FROM ranks GROUP BY run_id
HAVING max(last_ns) > $now - $active AND (NOT bool_and(final) OR max(last_ns) > $now - $grace)
"""

#: How long after its last heartbeat a run that did not end cleanly is still judged.
_ACTIVE_NS = 60 * 10**9
#: How often a run whose every rank is making progress is judged (a stalled one: every pass).
MOVING_EVERY_S = 10.0
#: How long after a clean end a run is still judged (for disagreements whose entries came late).
_ENDED_GRACE_NS = 10 * 10**9



def _key(run_id: str, f: Finding) -> tuple:
    return (run_id, f.kind, tuple(f.culprit_ranks), f.group, f.seq)


def watch_pass(con: duckdb.DuckDBPyConnection, *, now_ns: int | None = None, stall_s: float = 5.0,
               dead_s: float = 5.0, last_judged: dict[str, int] | None = None,
               moving_every_s: float = MOVING_EVERY_S) -> tuple[set[str], list[tuple[str, Finding]]]:
    """One pass over the active runs: the runs judged, and their current findings ``(run_id, finding)``.

    With ``last_judged`` (run id -> when it was last judged, updated here), a run whose every rank
    made progress within ``stall_s`` is judged only every ``moving_every_s``: nobody in it waits, so
    only a disagreement could be found, and the pass cost cores a training job shares."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    database = Database.over(con, "live database")
    found, judged = [], set()
    failures: list[str] = []
    for run_id, ranks, last_ns, final, progressed_ns, ended in con.execute(ACTIVE_RUNS_SQL, {
            "now": now_ns, "window": _WINDOW_NS, "active": _ACTIVE_NS, "grace": _ENDED_GRACE_NS}).fetchall():
        dead = {r for r, last, done in zip(ranks, last_ns, final) if not done and last < now_ns - dead_s * 1e9}
        over = {r for r, done in zip(ranks, final) if done}  # said goodbye: can no longer move
        if dead == set(ranks):  # every rank silent at once: the job was ended (run's kill, a
            continue                     # scheduler, the node): no contrast, and its last records are teardown
        moved = {r: p or 0 for r, p in zip(ranks, progressed_ns)}
        moving = not dead and not ended and all(moved[r] >= now_ns - stall_s * 1e9 for r in ranks)
        if moving and last_judged is not None and now_ns - last_judged.get(run_id, 0) < moving_every_s * 1e9:
            continue
        living = set(ranks) - dead - over
        stalled = not ended and all(moved[r] < now_ns - stall_s * 1e9 for r in living)
        has_entries = con.execute("SELECT count(*) > 0 FROM fr_entries WHERE run_id = ?", [run_id]).fetchall()[0][0]
        if not has_entries:  # a pipeline of transfers alone leaves none
            if stalled:
                judged.add(run_id)
                found += [(run_id, f) for f in _transfer_hang(database, run_id, living, now_ns, stall_s)]
            continue
        recently_stopped = {r for r in ranks if r not in dead
                            and now_ns - 3 * stall_s * 1e9 <= moved[r] < now_ns - stall_s * 1e9}
        progress = ring_progress(database, run_id)
        if progress.in_flight & recently_stopped:
            continue  # their last calls are on the way: judge the run when they are stored
        judged.add(run_id)
        if last_judged is not None:
            last_judged[run_id] = now_ns
        try:
            report = diagnose_stored(database, run_id, dead=dead, live=True, tail=TAIL_RECORDS, progress=progress)
        except Exception as exc:  # one run's data must not stop the watch over the others: counted
            failures.append(f"{run_id}: {type(exc).__name__}: {exc}"[:300])
            continue
        findings = report.findings
        if stalled and not any(finding.kind in WAIT_KINDS for finding in findings):
            findings = findings + _transfer_hang(database, run_id, living, now_ns, stall_s)
        for finding in findings:
            if ended and (finding.in_flight or finding.kind in WAIT_KINDS):
                continue  # every rank said goodbye: nobody waits any more
            involved = set(finding.culprit_ranks) | set(finding.waiting_ranks)
            settled = all(moved.get(r, 0) < now_ns - stall_s * 1e9 for r in involved - dead - over)
            if (finding.in_flight or finding.kind == "dead_rank") and not settled:
                continue
            if not finding.stack and finding.culprit_ranks:
                finding.stack = _published_stack(con, run_id, finding.culprit_ranks[0])
            found.append((run_id, finding))
    if failures:
        raise WatchFailed(judged, found, failures)
    return judged, found


def _transfer_hang(database, run_id: str, living: set[int], now_ns: int, stall_s: float) -> list[Finding]:
    """A hang of transfers alone, read from the ranks' stacks (``blocked_transfer_findings``) once
    no rank moved for ``stall_s``, and no rank's stack either: the tap publishes it again whenever
    the rank's place changes, so a pipeline whose transfers nothing counted (a ``send`` imported by
    name before the count was installed) still shows it moving."""
    published = stacks_published_ns(database, run_id)
    if any(published.get(rank, 0) >= now_ns - stall_s * 1e9 for rank in living):
        return []
    return blocked_transfer_findings(current_places(database, run_id))


class WatchFailed(Exception):
    """Some runs could not be judged; what was judged is carried along."""

    def __init__(self, judged: set[str], found: list, failures: list[str]) -> None:
        super().__init__("; ".join(failures))
        self.judged, self.found = judged, found


def _published_stack(con, run_id: str, rank: int) -> list[dict]:
    """The stack the rank's Flight Recorder tap published when its groups stopped moving."""
    rows = con.execute(STACK_SQL, {"run": run_id, "rank": rank}).fetchall()
    return json.loads(rows[0][0]).get("frames", [])[:20] if rows and rows[0][0] else []


class HangWatch:
    """Runs ``watch_pass`` every ``interval_s`` on its own cursor and keeps the episodes."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, interval_s: float = 2.0, stall_s: float = 5.0,
                 *, dead_s: float = 5.0, log=print) -> None:
        self._cursor = connection.cursor()
        self._log = log
        self._interval, self._stall, self._dead = interval_s, stall_s, dead_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rankstream-hang-watch", daemon=True)
        self.passes = 0
        self.failures = 0
        self._last_judged: dict[str, int] = {}
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
            except Exception as exc:  # counted and logged; the next pass tries again
                self.failures += 1
                if str(exc)[:300] != self.last_error:
                    self._log(f"rankstream hang watch: {type(exc).__name__}: {exc}"[:400])
                self.last_error = str(exc)[:300]

    def check(self, now_ns: int | None = None) -> list[tuple[str, Finding]]:
        now_ns = time.time_ns() if now_ns is None else now_ns
        try:
            judged, found = watch_pass(self._cursor, now_ns=now_ns, stall_s=self._stall, dead_s=self._dead,
                                       last_judged=self._last_judged)
        except WatchFailed as failed:  # keep what was judged, then report the rest
            record_episodes(self._cursor, failed.judged, failed.found, now_ns=now_ns)
            raise
        record_episodes(self._cursor, judged, found, now_ns=now_ns)
        self.passes += 1
        return found


def record_episodes(cursor, judged: set[str], found: list[tuple[str, Finding]], *, now_ns: int) -> None:
    """Open an episode for each new finding, extend the ones still found, close the others of the
    runs judged in this pass (a run no longer judged keeps its episodes as they were)."""
    if not judged and not found:
        return  # nothing to open, extend or close: no transaction
    with transaction(cursor):
        open_rows = cursor.execute("SELECT run_id, kind, culprit_ranks, pg_name, seq FROM live_findings "
                                   "WHERE cleared_ns IS NULL").fetchall()
        still = {_key(run, f) for run, f in found}
        for run_id, kind, culprits, group, seq in open_rows:
            key = (run_id, kind, tuple(culprits or ()), group, seq)
            if key not in still and run_id in judged:
                cursor.execute("UPDATE live_findings SET cleared_ns = $now WHERE run_id = $run AND kind = $kind "
                               "AND culprit_ranks IS NOT DISTINCT FROM $culprits AND pg_name IS NOT DISTINCT FROM "
                               "$group AND seq IS NOT DISTINCT FROM $seq AND cleared_ns IS NULL",
                               {"now": now_ns, "run": run_id, "kind": kind, "culprits": culprits, "group": group,
                                "seq": seq})
        opened = {(run, kind, tuple(c or ()), g, s) for run, kind, c, g, s in open_rows}
        for run_id, f in found:
            values = {"run": run_id, "kind": f.kind, "culprits": f.culprit_ranks, "group": f.group, "seq": f.seq,
                      "now": now_ns}
            if _key(run_id, f) in opened:
                cursor.execute("UPDATE live_findings SET last_seen_ns = $now, waiting_ranks = $waiting "
                               "WHERE run_id = $run AND kind = $kind AND culprit_ranks IS NOT DISTINCT FROM $culprits "
                               "AND pg_name IS NOT DISTINCT FROM $group AND seq IS NOT DISTINCT FROM $seq "
                               "AND cleared_ns IS NULL", {**values, "waiting": f.waiting_ranks})
            else:
                cursor.execute("INSERT INTO live_findings BY NAME SELECT $run AS run_id, $kind AS kind, "
                               "$culprits::INTEGER[] AS culprit_ranks, $group AS pg_name, $desc AS pg_desc, "
                               "$seq AS seq, $now AS first_seen_ns, $now AS last_seen_ns, "
                               "$waiting::INTEGER[] AS waiting_ranks, $detail AS detail, $evidence AS evidence, "
                               "$stack AS stack",
                               {**values, "desc": f.group_desc, "waiting": f.waiting_ranks, "detail": f.headline(),
                                "evidence": json.dumps(f.evidence), "stack": json.dumps(f.stack)})
