"""The diagnosis: every rank's Flight Recorder entries in, findings out, the root cause first.

The one engine behind ``rankstream diagnose DIR``, ``rankstream analyze collectives`` and the live
hang watch. In order:

1. collectives are matched per group and sequence number (``matching``); each group's first
   disagreement gets its culprits from a majority or, failing one, from evidence (``evidence``);
2. unfinished send/recv are paired (``p2p``);
3. the wait-for graph is built from where each rank is blocked (``waits``): its sinks, its cycles,
   and the positions at which a rank is stuck;
4. every candidate becomes a finding, and the one that explains the most blocked ranks is the root
   cause; the others that it explains are listed as its consequences;
5. only when nothing else is wrong, stragglers (``stragglers``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from rankstream.flows.diagnosis.entries import Entries
from rankstream.flows.diagnosis.evidence import decide, siblings_of
from rankstream.flows.diagnosis.findings import KINDS, Finding, blocks, verdict_of
from rankstream.flows.diagnosis.published_stacks import BlockedCall, OutsideCommunication
from rankstream.flows.diagnosis.groups import Group
from rankstream.flows.diagnosis.hang_findings import hang_findings, wait_graph
from rankstream.flows.diagnosis.matching import Disagreement, classify, first_disagreements
from rankstream.flows.diagnosis.own_program import call_in_program
from rankstream.flows.diagnosis.run import Run
from rankstream.flows.diagnosis.stragglers import find_stragglers
from rankstream.flows.diagnosis.waits import WaitGraph

__all__ = ["Diagnosis", "diagnose", "rooted"]


@dataclass
class Diagnosis:
    findings: list[Finding]
    ranks: list[int]
    world: int
    #: Ranks that are members of some group but left no data.
    missing: list[int]
    groups: dict[int, Group] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return verdict_of(self.findings)

    @property
    def root(self) -> Finding | None:
        return self.findings[0] if self.findings else None


def diagnose(entries: Entries, *, listed: dict[str, list[int]], dumped: list[int],
             clock_error_ns: int = 0,
             places: Callable[[], dict[int, BlockedCall | OutsideCommunication]] | None = None) -> Diagnosis:
    """Findings for one run (see the module docstring). ``listed``: group name -> the ranks the
    dumps list; ``dumped``: the ranks that left data; ``places``: reads where each rank's current
    live stack shows it (``published_stacks``), when needed."""
    run = Run(entries, listed, dumped, places=places)
    graph = wait_graph(run)
    disagreements = _judged_disagreements(run, {(p.group, p.seq) for p in graph.waiting})
    findings = _mismatch_findings(run, disagreements, graph) + hang_findings(run, graph, disagreements)
    said = {(f.group, f.seq, tuple(f.culprit_ranks)) for f in findings}  # a stuck rank is found twice
    findings += [f for f in _state_findings(run, disagreements) if (f.group, f.seq, tuple(f.culprit_ranks)) not in said]
    if not findings:
        members = {code: len(group.members) for code, group in run.groups.items()}
        findings = [_straggler_finding(s, run) for s in find_stragglers(run.calls, members,
                                                                         clock_error_ns=clock_error_ns)]
    ordered = rooted(findings)
    undescribed = {g.name: list(g.members) for g in run.groups.values() if g.undescribed}
    for finding in ordered:
        finding.group_ranks = undescribed.get(finding.group)
    members = {m for g in run.groups.values() for m in g.members}
    return Diagnosis(ordered, sorted(run.dumped), run.world, sorted(members - run.dumped), run.groups)


# -- 1. matching ------------------------------------------------------------------------------------
def _judged_disagreements(run: Run, blocked: set[tuple[int, int]]) -> list[Disagreement]:
    found = first_disagreements(run.calls, run.sequences)
    for d in found:  # majorities first: their culprits are evidence for the ties
        decide(d, run.sequences[d.group.code], [], suspects=set(), describe=run.describe) if _has_majority(d) else None
    suspects = {rank for d in found if d.culprits for rank in d.culprits}
    for d in found:
        seqs = run.sequences[d.group.code]
        if not d.culprits and d.undecided is None:
            own = {rank: call_in_program(run.calls, rank, group=d.group.code, seq=d.seq,
                                         from_start=run.starts_at_first_entry(rank)) for rank in d.values}
            decide(d, seqs, siblings_of(seqs, run.sequences), suspects=suspects, describe=run.describe,
                   own={rank: value for rank, value in own.items() if value is not None})
        classify(d, seqs, run.calls.unpack, blocked=(d.group.code, d.seq) in blocked)
    return found


def _has_majority(d: Disagreement) -> bool:
    counts = {}
    for value in d.values.values():
        counts[value] = counts.get(value, 0) + 1
    return max(counts.values()) * 2 > len(d.values)


def _mismatch_findings(run: Run, disagreements: list[Disagreement], graph: WaitGraph) -> list[Finding]:
    findings = []
    for d in disagreements:
        pending = {p.rank for p in graph.waiting if p.group == d.group.code and p.seq == d.seq}
        culprit_value = d.values[d.culprits[0]] if d.culprits else None
        actual = run.describe(culprit_value) if d.culprits else {str(r): run.describe(v) for r, v in d.values.items()}
        waiting = sorted((pending - set(d.culprits)) | graph.upstream(set(d.values)) - set(d.culprits))
        findings.append(Finding(
            kind=d.kind, culprit_ranks=d.culprits, group=d.group.name, group_desc=d.group.desc, seq=d.seq,
            expected=run.describe(d.expected), actual=actual, waiting_ranks=waiting, evidence=d.evidence,
            culprit_reason=d.undecided, in_flight=bool(pending)))
    return findings


# -- ranks that disagree on whether a collective completed ------------------------------------------
def _state_findings(run: Run, disagreements: list[Disagreement]) -> list[Finding]:
    derailed = {(d.group.code, rank) for d in disagreements for rank in d.values}
    findings = []
    unfinished = np.flatnonzero(run.calls.state < 2)
    candidates: dict[int, set[int]] = {}
    for code, seq in zip(run.calls.group[unfinished].tolist(), run.calls.seq[unfinished].tolist()):
        candidates.setdefault(code, set()).add(seq)
    for code, seqs in run.sequences.items():
        if code not in candidates:
            continue
        last = seqs.last_seq()
        for seq in sorted(candidates[code])[:64]:
            states = seqs.states_at(seq)
            moved_on = sorted(r for r, s in states.items() if s < 2 and last.get(r, seq) > seq
                              and (code, r) not in derailed and r not in run.stateless)
            if moved_on and any(s >= 2 for s in states.values()):
                findings.append(Finding(
                    kind="state_mismatch", culprit_ranks=moved_on, group=seqs.group.name, group_desc=seqs.group.desc,
                    seq=seq, expected=run.describe(seqs.usual_at(seq)),
                    actual={str(r): ("scheduled", "started", "completed")[s] for r, s in states.items()},
                    evidence=[f"rank(s) {moved_on} went on to later collectives of {seqs.group.label} without "
                              f"completing #{seq}, which their peers completed"]))
                break
    return findings


def _straggler_finding(straggler, run: Run) -> Finding:
    evidence = [
        f"takes {straggler.lateness_ns / 1e6:.1f} ms longer than its peers to reach a collective once "
        f"released from its previous one (trimmed mean over {straggler.collectives} collectives; threshold "
        f"{straggler.threshold_ns / 1e6:.1f} ms: the other ranks' noise, a tenth of a typical delay, the clock "
        f"error); "
        f"late in {straggler.late_share:.0%} of them, from {straggler.source}"]
    if straggler.confirmed:
        evidence.append(f"it waits {straggler.shortfall_ns / 1e6:.1f} ms less than its peers inside them (each "
                        "rank's own clock): it arrives last, not only its clock")
    elif straggler.shortfall_ns is not None:
        evidence.append(f"its waits inside them (each rank's own clock; {straggler.shortfall_ns / 1e6:+.1f} ms "
                        "short of its peers') are too coarse to rule out a clock ahead of its peers'")
    return Finding(kind="straggler", culprit_ranks=[straggler.rank], evidence=evidence)


# -- 4. the root cause first -------------------------------------------------------------------------
def rooted(findings: list[Finding], *, dead_first: bool = False) -> list[Finding]:
    """A finding that holds ranks up before one that does not (a hung job's root cause is what
    hangs it, not an older mismatch that completed); among them, the one with direct evidence that
    explains the most blocked ranks (then the most specific kind, then the oldest). The findings
    whose culprits it blocks become its consequences. A missing dump is the absence of evidence: it
    ranks after a fault shown by the ranks that left dumps that at least half as many ranks wait for.
    ``dead_first``: a rank known to have died leads (its peers' stalls follow from the death),
    unless its death is itself inferred to follow from another finding."""
    order = {kind: i for i, kind in enumerate(KINDS)}
    direct = max((len(f.waiting_ranks) for f in findings if f.kind != "missing_dump" and not f.inferred), default=0)
    for finding in findings:
        if finding.kind == "missing_dump" and 0 < len(finding.waiting_ranks) <= 2 * direct:
            finding.inferred = True
    findings = sorted(findings, key=lambda f: (not (dead_first and f.known_death), not blocks(f), f.inferred,
                                               -len(f.waiting_ranks), not f.culprit_ranks, order[f.kind],
                                               f.seq if f.seq is not None else 0))
    if not findings:
        return findings
    root, rest = findings[0], findings[1:]
    blocked = set(root.waiting_ranks) | set(root.culprit_ranks)
    consequences = [f for f in rest if f.culprit_ranks and set(f.culprit_ranks) <= blocked]
    root.explains = [f.headline() for f in consequences]
    return [root] + [f for f in rest if f not in consequences] + consequences
