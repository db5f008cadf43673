"""The diagnosis as users get it: from a dump directory or a stored run, as text or JSON.

``rankstream diagnose DIR`` and ``rankstream analyze collectives --run R`` both end here, with
the same engine and the same report: the root cause in one line first, then the details. The
stored path also writes the ``findings`` table, so SQL, the timeline and the report see them.
"""

from __future__ import annotations

import json
import functools
import time
from dataclasses import dataclass, field
from pathlib import Path

from rankstream.flows.diagnosis.blocked_transfers import blocked_transfer_findings
from rankstream.flows.diagnosis.engine import Diagnosis, diagnose, rooted
from rankstream.flows.diagnosis.exits import Endings, only_a_wait_ended, rank_endings
from rankstream.flows.diagnosis.findings import MISMATCH_KINDS, WAIT_KINDS, Finding, ranks_text
from rankstream.flows.diagnosis.hang_findings import STALLED_OUTSIDE, WENT_NOWHERE
from rankstream.flows.diagnosis.loader import inside_for, load_directory, stack_at, stack_file_places
from rankstream.flows.diagnosis.published_stacks import BlockedCall, current_places, innermost_call
from rankstream.flows.diagnosis.ring_progress import RingProgress
from rankstream.flows.diagnosis.stored import load_stored
from rankstream.schemas.errors import BadInput

__all__ = ["Report", "diagnose_directory", "diagnose_stored", "findings_statements"]


@dataclass
class Report:
    run_id: str
    diagnosis: Diagnosis
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def findings(self) -> list[Finding]:
        return self.diagnosis.findings

    @property
    def verdict(self) -> str:
        return self.diagnosis.verdict

    @property
    def root_cause(self) -> str | None:
        root = self.diagnosis.root
        return f"root cause: {root.headline()}" if root else None

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "healthy" else 1

    def as_json(self) -> dict:
        d = self.diagnosis
        return {"run_id": self.run_id, "verdict": self.verdict, "root_cause": self.root_cause,
                "findings": [f.as_json() for f in d.findings], "ranks": d.ranks, "world_size": d.world,
                "missing_ranks": d.missing}


def diagnose_directory(directory: Path, *, prefix: str = "rank", selected_ranks: set[int] | None = None,
                       pg_filters: set[str] | None = None, mismatch_cap: int | None = None,
                       stacks: bool = True) -> Report:
    """Every dump of ``directory`` (``<prefix><rank>``), diagnosed; the culprits' stacks are read
    from their own dumps afterwards."""
    started = time.perf_counter()
    loaded = load_directory(directory, prefix, selected_ranks=selected_ranks, pg_filters=pg_filters)
    read = time.perf_counter()
    result = diagnose(loaded.entries, listed=loaded.listed, dumped=sorted(loaded.files),
                      places=lambda: stack_file_places(directory))
    _cap(result, mismatch_cap)
    if stacks:
        for finding in result.findings:
            for rank in finding.culprit_ranks[:1]:
                if rank in loaded.files:
                    finding.stack = stack_at(loaded.files[rank], finding.group, finding.seq)
    for finding in result.findings[:_TIMED_FINDINGS]:
        line = _time_inside(finding, loaded.files)
        if line:
            finding.evidence.append(line)
    return Report(f"fr-{directory.resolve().name}", result,
                  {"read": read - started, "diagnose": time.perf_counter() - read})


def diagnose_stored(database, run_id: str, *, mismatch_cap: int | None = None, dead: set[int] = frozenset(),
                    clock_error_ns: int = 0, live: bool = False, tail: int | None = None,
                    progress: RingProgress | None = None, job_over: bool = False,
                    ended_here_ns: int | None = None, fatal: dict[int, str] | None = None) -> Report:
    """A run in the database (live or imported). ``dead``: ranks known to have died (live: their
    heartbeats stopped; otherwise the ranks that ended without a word while their peers said how
    they ended, see ``exits``), which are then named as such rather than as missing dumps or
    skipped calls. ``live``: the run is still going; ``tail``: judge only each rank's last
    records; ``progress``: the run's ``ring_progress`` when the caller already read it (see
    ``stored.load_stored``); ``job_over``: the job's processes are known to be gone (``run`` after
    its job), so no silent rank is still running, however recently it was heard from;
    ``ended_here_ns``: when ``run --on-hang kill`` ended it, ``fatal``: the fatal errors ranks
    reported (see ``exits.rank_endings``)."""
    started = time.perf_counter()
    endings = None if live else rank_endings(database, run_id, now_ns=time.time_ns(), job_over=job_over,
                                             ended_here_ns=ended_here_ns, fatal=fatal)
    dead = endings.dead if endings and not dead else dead
    stored = load_stored(database, run_id, live=live, dead=dead, tail=tail, progress=progress)
    if not len(stored.entries):
        if endings and endings.dead:  # it died before any entry of the job reached the bus
            result = Diagnosis([], [], len(endings.ends), sorted(endings.dead))
            _name_the_dead(result, dead, endings)
            return Report(run_id, result, {"read": time.perf_counter() - started, "diagnose": 0.0})
        if endings:  # a pipeline of transfers alone, calls gloo does not record
            result = Diagnosis([], sorted(end.rank for end in endings.ends), len(endings.ends), [])
            _read_what_no_entry_shows(result, endings, lambda: current_places(database, run_id))
            if result.findings:
                return Report(run_id, result, {"read": time.perf_counter() - started, "diagnose": 0.0})
        raise BadInput(f"run {run_id!r} has no Flight Recorder entries")
    read = time.perf_counter()
    # live, a dead rank's entries stop at its last snapshot, read as no dump; after the run they
    # are all there is, and show how far it got
    dumped = [rank for rank in stored.dumped if rank not in dead or not live]
    clock_error_ns = max(clock_error_ns, stored.clock_error_ns)
    places = functools.cache(lambda: current_places(database, run_id))
    result = diagnose(stored.entries, listed=stored.listed, dumped=dumped, clock_error_ns=clock_error_ns,
                      places=places)
    _name_the_dead(result, dead, endings)
    _name_the_departed(result, endings)
    _read_what_no_entry_shows(result, endings, places)
    _cap(result, mismatch_cap)
    for finding in result.findings:
        if finding.culprit_ranks and finding.group is not None:
            finding.stack = _stored_stack(database, run_id, finding)
    return Report(run_id, result, {"read": read - started, "diagnose": time.perf_counter() - read})


#: The findings (root first) told how long their waiting ranks had been inside the call; each
#: reads a waiting rank's dump again, as the stacks do.
_TIMED_FINDINGS = 3


def _time_inside(finding: Finding, files: dict[int, Path]) -> str | None:
    """How long a waiting rank had been inside the call when it dumped (``loader.inside_for``):
    what tells a hang dumped after a timeout from a dump taken while the job ran, which the
    calls alone cannot (the same ranks are inside the same call in both)."""
    if finding.kind not in WAIT_KINDS or finding.group is None or not finding.seq:
        return None
    for rank in [r for r in finding.waiting_ranks if r in files][:4]:
        inside = inside_for(files[rank], finding.group, finding.seq)
        if inside is not None:
            text = f"{inside / 1e9:,.1f} s" if inside >= 10**9 else f"{inside / 1e6:,.1f} ms"
            return (f"rank {rank} enqueued #{finding.seq} {text} before it wrote its dump and was inside it then "
                    "(torch stamps a call it finds started at the dump)"
                    + (": under a second, so if the dumps were taken while the job ran rather than after a "
                       "timeout, it may have been running normally" if inside < 10**9 else ""))
    return None


def _name_the_departed(result: Diagnosis, endings: Endings | None) -> None:
    """A rank its peers wait for in a call it never issued, and which then closed cleanly, left
    the job instead (a shorter data shard, an early return): said so, rather than that it skipped
    the call, which sends the user looking for a conditional collective."""
    if endings is None:
        return
    left = {end.rank for end in endings.ends if end.how == "goodbye"}
    for finding in result.findings:
        if finding.kind == "skipped_collective" and finding.culprit_ranks and not finding.actual \
                and set(finding.culprit_ranks) <= left:
            finding.actual = {"left": True}
            finding.evidence = [f"{ranks_text(finding.culprit_ranks)} closed cleanly (its last heartbeat says "
                                "goodbye) instead of issuing the call"] + [
                line for line in finding.evidence if not line.startswith((WENT_NOWHERE, STALLED_OUTSIDE))]
            _lead_over_extras(result, finding)


def _read_what_no_entry_shows(result: Diagnosis, endings: Endings | None, places) -> None:
    """After the job, when the entries found nothing and some rank did not end cleanly: a hang of
    transfers alone (gloo records none), read from the ranks' stacks; else a failure no call
    shows. ``places``: the ranks' current places, read when needed."""
    if result.findings or endings is None or all(end.how == "goodbye" for end in endings.ends):
        return
    result.findings[:] = blocked_transfer_findings(places())
    _name_a_failure_no_call_shows(result, endings, places())


def _name_a_failure_no_call_shows(result: Diagnosis, endings: Endings, places: dict) -> None:
    """Ranks failed and no call shows why (the calls they waited in are not in the Flight
    Recorder: gloo's ``monitored_barrier`` is sends and receives). When a rank closed cleanly
    first and the failed ranks' stacks (live, or where their exceptions were raised) show them
    inside a ``torch.distributed`` call, the rank that closed left the job early; otherwise the
    first failure leads, in its own words. Never "healthy" for a job whose ranks failed (live
    probe 14: three ranks failed in a monitored_barrier that a fourth had returned early from, and
    the run was called healthy)."""
    if result.findings:
        return
    failed = sorted((end for end in endings.ends if end.how == "exception"), key=lambda end: end.at_ns or 0)
    if not failed:
        return
    first_failure = failed[0].at_ns or 0
    left = sorted(end.rank for end in endings.ends if end.how == "goodbye" and (end.at_ns or 0) <= first_failure)
    inside = {end.rank: call for end in failed
              if isinstance(call := places.get(end.rank) or innermost_call(end.frames), BlockedCall)}
    if left and inside:
        calls = sorted({call.function for call in inside.values()})
        result.findings.append(Finding(
            kind="skipped_collective", culprit_ranks=left, expected={"op": " or ".join(calls)},
            actual={"left": True}, waiting_ranks=sorted(end.rank for end in failed),
            evidence=[f"{ranks_text(left)} closed cleanly (its last heartbeat says goodbye) before any other rank "
                      "ended"] + [f"rank {rank} was in {call}" for rank, call in inside.items()]
                     + [f"then {ranks_text([end.rank for end in failed])} failed: {failed[0].reason[:300]}"]))
        return
    first = next((end for end in failed if not only_a_wait_ended(end.reason)), failed[0])
    evidence = [f"rank {first.rank} ended first on {first.reason[:300]}; no call in the Flight Recorder shows why"]
    if only_a_wait_ended(first.reason):  # every failure is a wait that ended: the cause is unseen
        evidence.append("its error says only that a wait ended: the rank it waited for, which no call or stack "
                        "shows here, is the cause")
    result.findings.append(Finding(kind="dead_rank", culprit_ranks=[first.rank], inferred=True,
                                   actual={"ended": endings.described(first.rank)}, evidence=evidence))


def _lead_over_extras(result: Diagnosis, departed: Finding) -> None:
    """The ranks waiting in the call a departed rank never issued are not ranks that issued an
    extra call when they are at least as many as the ranks that left (live probe 14: two of three
    ranks waited in a final barrier after the third returned early, and the first of them was
    named for "an extra barrier"). The departure leads; the extra calls are dropped, or, on a tie,
    kept after it as the other reading."""
    extras = [f for f in result.findings
              if f.kind == "extra_collective" and (f.group, f.seq) == (departed.group, departed.seq)]
    if not extras:
        return
    waiting = sorted({rank for f in extras for rank in f.culprit_ranks} | set(departed.waiting_ranks))
    if len(waiting) < len(departed.culprit_ranks):
        return
    departed.waiting_ranks = waiting
    first = min(result.findings.index(f) for f in extras)
    tie = len(waiting) == len(departed.culprit_ranks)
    kept = [f for f in result.findings if f is not departed and (f not in extras or tie)]
    before = [f for f in result.findings[:first] if f in kept]
    result.findings[:] = before + [departed] + [f for f in kept if f not in before]


def _name_the_dead(result: Diagnosis, dead: set[int], endings: Endings | None) -> None:
    """A rank waited for that died is named as dead, not as having skipped the call, and leads:
    its peers' waits follow from it (after the run, with ``endings`` known, a tie with a peer whose
    last entry was lost in the teardown is no tie either). Deaths the findings do not all
    name (several ranks died at once; one died before any call showed it) lead as one finding."""
    renamed = False
    # a call fed data that does not fit it: a mismatch, or a skip that sent the next call's data
    mismatched = {(f.group, f.seq): f for f in result.findings if f.culprit_ranks and (
        f.kind in MISMATCH_KINDS or (f.kind == "skipped_collective" and isinstance(f.actual, dict) and "op" in f.actual))}
    for finding in result.findings:
        if finding.kind in ("missing_dump", "skipped_collective") and finding.culprit_ranks \
                and set(finding.culprit_ranks) <= set(dead):
            renamed = True
            finding.kind, finding.inferred = "dead_rank", False  # a death is seen, not inferred
            finding.actual = {"ended": endings.described(finding.culprit_ranks[0]) if endings else None}
            finding.evidence = (endings.evidence if endings else [
                f"{ranks_text(finding.culprit_ranks)} stopped sending heartbeats"]) + [
                line for line in finding.evidence
                if not line.startswith((WENT_NOWHERE, STALLED_OUTSIDE))]  # it died: known
            cause = mismatched.get((finding.group, finding.seq))
            if cause is not None:  # gloo aborts the member that receives mismatched data: a victim
                finding.inferred = True
                finding.evidence.append(f"{cause.headline()}: a collective fed mismatched data aborts a member "
                                        "(gloo does), so this death follows from that mismatch")
    if renamed:  # ranked again as what it is
        for finding in result.findings:
            finding.explains = []
        result.findings[:] = rooted(result.findings, dead_first=True)
    if endings is None or not endings.dead:
        return
    named = [finding for finding in result.findings if finding.kind == "dead_rank"]
    if len(named) > 1 or {rank for finding in named for rank in finding.culprit_ranks} != endings.dead:
        waiting = {rank for finding in named for rank in finding.waiting_ranks} - endings.dead
        result.findings.insert(0, Finding(kind="dead_rank", culprit_ranks=sorted(endings.dead),
                                          actual={"ended": endings.described(min(endings.dead))},
                                          waiting_ranks=sorted(waiting), evidence=list(endings.evidence)))
    result.findings.sort(key=lambda finding: not finding.known_death)


def _stored_stack(database, run_id: str, finding: Finding) -> list[dict]:
    rows = database.fetchall(
        "SELECT frames FROM fr_entries WHERE run_id = $run AND rank = $rank AND pg_name = $group AND frames IS NOT NULL "
        "AND (collective_seq_id = $seq OR p2p_seq_id = $seq OR $seq IS NULL) ORDER BY snapshot_ns DESC LIMIT 1",
        {"run": run_id, "rank": finding.culprit_ranks[0], "group": finding.group, "seq": finding.seq})
    return list(rows[0][0])[:20] if rows and rows[0][0] else []


def _cap(result: Diagnosis, mismatch_cap: int | None) -> None:
    if mismatch_cap is not None:
        result.findings = result.findings[:max(1, mismatch_cap)]


def findings_statements(report: Report) -> list[tuple[str, dict]]:
    """The statements that replace the run's rows of ``findings`` (one transaction, see ``run_tables``)."""
    rows = [{"run_id": report.run_id, "position": i, "kind": f.kind, "pg_name": f.group, "pg_desc": f.group_desc,
             "seq": f.seq, "culprit_ranks": f.culprit_ranks, "waiting_ranks": f.waiting_ranks,
             "expected": json.dumps(f.expected, default=str), "actual": json.dumps(f.actual, default=str),
             "detail": f.headline(), "evidence": json.dumps(f.evidence), "explains": json.dumps(f.explains),
             "stack": json.dumps(f.stack), "in_flight": f.in_flight}
            for i, f in enumerate(report.findings)]
    return [("DELETE FROM findings WHERE run_id = $run", {"run": report.run_id})] + ([(INSERT_FINDINGS_SQL, {
        "rows": json.dumps(rows)})] if rows else [])


INSERT_FINDINGS_SQL = """
INSERT INTO findings BY NAME
SELECT unnest(from_json($rows, '[{"run_id": "VARCHAR", "position": "INTEGER", "kind": "VARCHAR",
    "pg_name": "VARCHAR", "pg_desc": "VARCHAR", "seq": "BIGINT", "culprit_ranks": "INTEGER[]",
    "waiting_ranks": "INTEGER[]", "expected": "VARCHAR", "actual": "VARCHAR", "detail": "VARCHAR",
    "evidence": "VARCHAR", "explains": "VARCHAR", "stack": "VARCHAR", "in_flight": "BOOLEAN"}]'), recursive := true)
"""
