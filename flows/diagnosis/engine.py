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

import functools
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from rankstream.flows.diagnosis.calls import Calls, collective_calls
from rankstream.flows.diagnosis.entries import Entries
from rankstream.flows.diagnosis.evidence import decide, siblings_of
from rankstream.flows.diagnosis.findings import KINDS, Finding, verdict_of
from rankstream.flows.diagnosis.groups import Group, find_groups
from rankstream.flows.diagnosis.matching import Disagreement, classify, first_disagreements
from rankstream.flows.diagnosis.origin import shift_origin
from rankstream.flows.diagnosis.p2p import unmatched_p2p
from rankstream.flows.diagnosis.sequences import GroupSequences, period_of, split_by_group
from rankstream.flows.diagnosis.stragglers import find_stragglers
from rankstream.flows.diagnosis.waits import (Edge, Position, WaitGraph, build_wait_graph, gone_past, program_between,
                                              waiting_positions)

__all__ = ["Diagnosis", "diagnose"]


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


class _Run:
    """What the steps share: the entries, their calls, the groups and how to describe a call."""

    def __init__(self, entries: Entries, listed: dict[str, list[int]], dumped: list[int]) -> None:
        self.entries = entries
        self.groups, self.world = find_groups(entries, listed, dumped)
        self.dumped = set(dumped)
        self.calls: Calls = collective_calls(entries)
        self.sequences: dict[int, GroupSequences] = split_by_group(self.calls, self.groups)
        self.stateless = _stateless_ranks(entries)

    def describe(self, value: int | None) -> dict | None:
        if value is None:
            return None
        op, shape, dtype = self.calls.unpack(value)
        vocab = self.entries.vocabulary
        return {"op": vocab.ops[op], "shape": vocab.text("shapes", shape), "dtype": vocab.text("dtypes", dtype)}

    def group(self, code: int) -> Group:
        return self.groups[code]


def _stateless_ranks(entries: Entries) -> set[int]:
    """Ranks whose entries never say whether they finished (gloo: all 'scheduled', no times)."""
    progressed = np.unique(entries.rank[entries.state > 0])
    return set(np.unique(entries.rank).tolist()) - set(progressed.tolist())


def diagnose(entries: Entries, *, listed: dict[str, list[int]], dumped: list[int],
             clock_error_ns: int = 0) -> Diagnosis:
    """Findings for one run (see the module docstring). ``listed``: group name -> the ranks the
    dumps list; ``dumped``: the ranks that left data."""
    run = _Run(entries, listed, dumped)
    graph = _wait_graph(run)
    disagreements = _judged_disagreements(run, {(p.group, p.seq) for p in graph.waiting})
    findings = _mismatch_findings(run, disagreements, graph) + _wait_findings(run, graph, disagreements)
    findings += _state_findings(run, disagreements)
    if not findings:
        members = {code: len(group.members) for code, group in run.groups.items()}
        findings = [_straggler_finding(s, run) for s in find_stragglers(run.calls, members,
                                                                         clock_error_ns=clock_error_ns)]
    ordered = _rooted(findings)
    members = {m for g in run.groups.values() for m in g.members}
    return Diagnosis(ordered, sorted(run.dumped), run.world, sorted(members - run.dumped), run.groups)


# -- 1. matching ------------------------------------------------------------------------------------
def _judged_disagreements(run: _Run, blocked: set[tuple[int, int]]) -> list[Disagreement]:
    found = first_disagreements(run.calls, run.sequences)
    for d in found:  # majorities first: their culprits are evidence for the ties
        decide(d, run.sequences[d.group.code], [], set(), run.describe) if _has_majority(d) else None
    suspects = {rank for d in found if d.culprits for rank in d.culprits}
    for d in found:
        seqs = run.sequences[d.group.code]
        if not d.culprits and d.undecided is None:
            decide(d, seqs, siblings_of(seqs, run.sequences), suspects, run.describe)
        classify(d, seqs, run.calls.unpack, blocked=(d.group.code, d.seq) in blocked)
    return found


def _has_majority(d: Disagreement) -> bool:
    counts = {}
    for value in d.values.values():
        counts[value] = counts.get(value, 0) + 1
    return max(counts.values()) * 2 > len(d.values)


def _mismatch_findings(run: _Run, disagreements: list[Disagreement], graph: WaitGraph) -> list[Finding]:
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


# -- 2-3. p2p pairing and the wait-for graph --------------------------------------------------------
def _wait_graph(run: _Run) -> WaitGraph:
    graph = build_wait_graph(waiting_positions(run.calls, run.stateless), run.sequences, run.dumped,
                             run.stateless)
    for gap in unmatched_p2p(run.entries):
        position = Position(gap.waiter, gap.group, -gap.p2p_seq)  # a negative seq marks a p2p position
        graph.waiting.append(position)
        graph.add(Edge(position, gap.peer, "absent"))
    return graph


def _wait_findings(run: _Run, graph: WaitGraph, disagreements: list[Disagreement]) -> list[Finding]:
    findings = []
    disputed = {(p.group, p.seq) for p in graph.disputed}
    explained = {rank for d in disagreements if (d.group.code, d.seq) in disputed for rank in d.values}
    for position in graph.stuck:
        findings.append(_stuck(run, graph, position))
    settled = explained | {p.rank for p in graph.stuck}
    extra = _extra_callers(run, graph)
    for rank, position in extra.items():
        findings.append(_extra(run, graph, rank, position))
    settled |= set(extra)
    passed = _gone_past(run, graph, settled)
    for cycle in graph.cycles():  # two or more ranks that each went past a call: a deadlock
        if len(set(cycle) & set(passed)) >= 2:
            for rank in cycle:
                passed.pop(rank, None)
    for rank in sorted(passed):
        findings.append(_absent(run, graph, rank, passed[rank]))
    settled |= set(passed)
    for sink in graph.sinks():  # only a rank that never issued a call is a root; one enqueued behind
        if sink not in settled and any(e.how == "absent" for e in graph.into(sink)):  # is elsewhere
            finding = _absent(run, graph, sink, [e for e in graph.into(sink) if e.how == "absent"])
            if finding.kind == "skipped_collective":  # nothing shows it went past: it may be blocked in a
                finding.evidence.append(f"nothing shows where rank {sink} went instead: it is stalled outside "
                                        "collectives or blocked in a call the Flight Recorder does not record "
                                        "(gloo's send/recv)")
                finding.inferred = True  # ranked after the findings with direct evidence
            findings.append(finding)
            settled.add(sink)
    reaching = graph.upstream(settled) | settled
    for cycle in graph.cycles():
        if set(cycle) & reaching:
            continue
        edges = [edge for rank in cycle for edge in graph.edges[rank] if edge.target in cycle]
        first = edges[0].waiter
        findings.append(Finding(
            kind="deadlock", culprit_ranks=cycle, group=run.group(first.group).name,
            group_desc=run.group(first.group).desc, seq=first.seq if first.seq > 0 else None,
            waiting_ranks=sorted(graph.upstream(set(cycle))), in_flight=True,
            evidence=[f"rank {e.waiter.rank} waits in {_where(run, e.waiter)} for rank {e.target}" for e in edges]))
    return findings


def _legitimate(run: _Run, position: Position) -> bool:
    """Whether the call a rank waits in is one the job issues there: a sibling group issued the
    same call at that sequence number, or the group's earlier calls predict it; and, when nobody
    else ever got that far in the group, the rank's calls of the group line up with the program
    (a rank with an extra call earlier is one ahead of everybody)."""
    if position.seq < 0:
        return True
    seqs = run.sequences[position.group]
    value = seqs.values_at(position.seq).get(position.rank)
    family = siblings_of(seqs, run.sequences)
    if any(value in s.values_at(position.seq).values() for s in family):
        return True
    history = {seq: v for seq, v in seqs.consensus().items() if seq < position.seq}
    predicted = seqs.predicted(history, position.seq)
    if predicted is not None and predicted != value:
        return False
    if family and len(seqs.values_at(position.seq)) == 1:
        peers = [m for m in seqs.group.members if m != position.rank and m in run.dumped]
        return shift_origin(run.calls, position.rank, position.group, peers, position.seq) is None
    return True


def _extra_callers(run: _Run, graph: WaitGraph) -> dict[int, Position]:
    """Ranks waiting, for peers that never came, in a call the job does not issue there."""
    found = {}
    for rank, edges in graph.edges.items():
        for edge in edges:
            if edge.how == "absent" and edge.target in run.dumped and not _legitimate(run, edge.waiter):
                found.setdefault(rank, edge.waiter)
    return found


def _gone_past(run: _Run, graph: WaitGraph, settled: set[int]) -> dict[int, list[Edge]]:
    """Absent ranks that went past the call they are waited in (they skipped it): rank -> edges."""
    group_desc = {code: group.desc or group.name for code, group in run.groups.items()}
    references: dict[tuple[int, int], Counter] = {}
    found: dict[int, list[Edge]] = {}
    for edges in graph.edges.values():
        for edge in edges:
            if edge.how != "absent" or edge.target not in run.dumped or edge.target in settled \
                    or edge.waiter.rank in settled or edge.waiter.seq <= 0:
                continue
            where = (edge.waiter.group, edge.waiter.seq)
            if where not in references:
                references[where] = _program_between(run, group_desc, edge.waiter.group, edge.waiter.seq)
            if gone_past(edge, run.calls, group_desc, references[where]):
                found.setdefault(edge.target, []).append(edge)
    return found


def _program_between(run: _Run, group_desc: dict[int, str], group: int, seq: int) -> Counter:
    """What the job issues between calls ``seq - 1`` and ``seq`` of a group, from its members and
    its siblings, and from the same place one and two periods earlier (where only the rank at
    fault got as far as ``seq``, its own gap would be the only example)."""
    seqs = run.sequences[group]
    family = [group] + [s.group.code for s in siblings_of(seqs, run.sequences)]
    reference = program_between(run.calls, group_desc, family, seq)
    period = period_of(seqs.consensus())
    for back in (period, 2 * period) if period else ():
        if seq - back > 1:
            reference |= program_between(run.calls, group_desc, family, seq - back)
    return reference


def _where(run: _Run, position: Position) -> str:
    group = run.group(position.group).label
    return f"p2p #{-position.seq} of {group}" if position.seq < 0 else f"#{position.seq} of {group}"


def _stuck(run: _Run, graph: WaitGraph, position: Position) -> Finding:
    seqs = run.sequences[position.group]
    value = seqs.values_at(position.seq)[position.rank]
    went_on = seqs.last_seq().get(position.rank, position.seq) > position.seq
    state = "started" if seqs.states_at(position.seq)[position.rank] else "scheduled"
    return Finding(
        kind="state_mismatch" if went_on else "stuck_in_collective", culprit_ranks=[position.rank],
        group=seqs.group.name, group_desc=seqs.group.desc, seq=position.seq, expected=run.describe(value),
        actual=run.describe(value), waiting_ranks=sorted(graph.upstream({position.rank})), in_flight=True,
        evidence=[f"every other member of {seqs.group.label} completed #{position.seq}; rank {position.rank}'s "
                  f"entry is still {state}"] + ([f"rank {position.rank} enqueued later calls of the group"]
                                                 if went_on else []))


def _extra(run: _Run, graph: WaitGraph, rank: int, position: Position) -> Finding:
    seqs = run.sequences[position.group]
    value = seqs.values_at(position.seq)[rank]
    absent = sorted(e.target for e in graph.edges[rank] if e.waiter == position)
    evidence = [f"rank {rank} waits in #{position.seq} of {seqs.group.label} for ranks {absent}, which never "
                "issued it", "no sibling group issued that call there, and the group's earlier calls do not "
                "predict it"]
    seq, stretch = _origin(run, rank, seqs, position.seq, evidence)
    return Finding(
        kind="extra_collective", culprit_ranks=[rank], group=seqs.group.name, group_desc=seqs.group.desc,
        seq=seq, seq_range=stretch, actual=run.describe(value), waiting_ranks=sorted(graph.upstream({rank})),
        in_flight=True, evidence=evidence)


def _origin(run: _Run, rank: int, seqs: GroupSequences, hang_seq: int,
            evidence: list[str]) -> tuple[int, tuple[int, int] | None]:
    """Where the rank's shift began, when long before the hang (see ``origin``), and the stretch
    when its calls there are all alike (the dumps cannot tell which one it was)."""
    peers = [m for m in seqs.group.members if m != rank and m in run.dumped]
    stretch = shift_origin(run.calls, rank, seqs.group.code, peers, hang_seq)
    if stretch is None:
        return hang_seq, None
    first, last = stretch
    mine = seqs.calls_of(rank)
    alike = last > first and len({mine.get(s) for s in range(first, last + 1)}) == 1
    evidence.append(f"its calls of {seqs.group.label} stop lining up with its peers' program in the stretch "
                    f"#{first}-#{last} (what it issued between them differs from then on)"
                    + ("; those calls are identical, so which one it was cannot be told" if alike else "")
                    + f"; the job ran on until #{hang_seq}")
    return first, (first, last) if alike else None


def _first_in_program(run: _Run, edges: list[Edge]) -> Edge:
    """Of the calls a rank is waited in, the one it would have reached first. Program order comes
    from the rank's peers (the members of its groups short of the whole job) that issued the
    same calls (the same group kind and sequence number, in their own groups of that kind): their
    record ids order them, by majority; else creation times do."""
    unique = list({(e.waiter.group, e.waiter.seq): e for e in edges}.values())
    if len(unique) == 1:
        return unique[0]
    keys = {e: (run.group(e.waiter.group).desc or run.group(e.waiter.group).name, e.waiter.seq) for e in unique}
    target = unique[0].target
    peers = {m for g in run.groups.values() if target in g.members and len(g.members) < run.world
             for m in g.members} - {target}  # not the whole world: other pipeline stages run other programs
    records = {rank: r for rank, r in _records_by_kind(run, set(keys.values())).items() if rank in peers}

    def before(a: Edge, b: Edge) -> int:
        votes = [records[r][keys[a]] < records[r][keys[b]] for r in records if keys[a] in records[r]
                 and keys[b] in records[r]]
        if votes:
            return -1 if sum(votes) * 2 >= len(votes) else 1
        created = lambda e: min(_created(run, e), default=0)  # noqa: E731
        return -1 if created(a) < created(b) else 1 if created(a) > created(b) else 0

    return sorted(unique, key=functools.cmp_to_key(before))[0]


def _records_by_kind(run: _Run, wanted: set[tuple]) -> dict[int, dict[tuple, int]]:
    """rank -> {(group kind, seq): record} for the wanted calls (a negative seq: p2p)."""
    entries, out = run.entries, {}
    kinds = np.array([(desc or name) for name, desc in entries.vocabulary.groups], dtype=object)
    kind_of = kinds[entries.group] if len(entries) else np.array([], dtype=object)
    seq = np.where(entries.is_p2p, -entries.p2p_seq, entries.seq)
    for kind, number in wanted:
        rows = np.flatnonzero((kind_of == kind) & (seq == number))
        for rank, record in zip(entries.rank[rows].tolist(), entries.record[rows].tolist()):
            out.setdefault(rank, {})[(kind, number)] = record
    return out


def _completed_later(run: _Run, rank: int, where: Position) -> str | None:
    """A collective that ``rank`` (which left no dump) completed with its peers after ``where`` in
    their program order, described; None when there is none (it may have died before ``where``)."""
    if where.seq < 0:
        return None
    calls, key = run.calls, (run.group(where.group).desc or run.group(where.group).name, where.seq)
    for code, group in run.groups.items():
        if rank not in group.members or len(group.members) >= run.world or code not in run.sequences:
            continue
        seqs = run.sequences[code]
        others = [m for m in group.members if m != rank and m in run.dumped]
        rows = np.flatnonzero((calls.group == code) & (calls.state >= 2))
        done = [int(s) for s in np.unique(calls.seq[rows])
                if set(seqs.states_at(int(s))) >= set(others) and all(v >= 2 for v in seqs.states_at(int(s)).values())]
        kind = group.desc or group.name
        for seq in sorted(done, reverse=True)[:1]:
            records = _records_by_kind(run, {key, (kind, seq)})
            votes = [r[key] < r[(kind, seq)] for r in records.values() if key in r and (kind, seq) in r]
            if votes and sum(votes) * 2 > len(votes):
                return f"#{seq} of {group.label}"
    return None


def _created(run: _Run, edge: Edge) -> list[int]:
    if edge.waiter.seq < 0:
        return [g.created for g in unmatched_p2p(run.entries)
                if (g.waiter, g.group, -g.p2p_seq) == (edge.waiter.rank, edge.waiter.group, edge.waiter.seq)]
    rows = run.sequences[edge.waiter.group].rows_at(edge.waiter.seq)
    return [int(run.calls.created[r]) for r in rows.values()]


def _absent(run: _Run, graph: WaitGraph, rank: int, edges: list[Edge]) -> Finding:
    """A rank others wait for in a call it never issued: it skipped it, or left no dump."""
    if not edges:
        edges = graph.into(rank)
    where = _first_in_program(run, edges).waiter
    group = run.group(where.group)
    waiting = sorted(graph.upstream({rank}))
    if where.seq < 0:
        gap = next(g for g in unmatched_p2p(run.entries) if g.waiter == where.rank and g.peer == rank)
        kind = "p2p_unmatched" if rank in run.dumped else "missing_dump"
        return Finding(kind=kind, culprit_ranks=[rank], group=group.name, group_desc=group.desc, seq=-where.seq,
                       expected={"op": "recv" if gap.op == "send" else "send", "peer": gap.waiter},
                       waiting_ranks=waiting, in_flight=True,
                       evidence=[f"rank {gap.waiter}'s {gap.op} (p2p #{gap.p2p_seq} of {group.label}) has no "
                                 f"counterpart posted by rank {rank}"])
    seqs = run.sequences[where.group]
    values = list(seqs.values_at(where.seq).values())
    expected = max(set(values), key=values.count) if values else None
    if rank not in run.dumped:
        later = _completed_later(run, rank, where)
        if later is not None:  # it took part in a later call: it was alive and went past this one
            return Finding(kind="skipped_collective", culprit_ranks=[rank], group=group.name,
                           group_desc=group.desc, seq=where.seq, expected=run.describe(expected),
                           waiting_ranks=waiting, in_flight=True, evidence=[
                               f"rank {rank} left no dump, but its peers completed {later} with it, which comes "
                               f"after #{where.seq} of {group.label} in their program: it went past it"])
        return Finding(kind="missing_dump", culprit_ranks=[rank], group=group.name, group_desc=group.desc,
                       seq=where.seq, expected=run.describe(expected), waiting_ranks=waiting, in_flight=True,
                       evidence=[f"rank {rank} left no dump; {len(waiting)} rank(s) wait for it, first in "
                                 f"{_where(run, where)}"])
    last = seqs.last_seq().get(rank)
    evidence = [f"rank {rank}'s last call in {group.label} is " + (f"#{last}" if last else "none") +
                f"; its peers wait in #{where.seq}"]
    now = [p for p in graph.waiting if p.rank == rank]
    if now:
        evidence.append(f"rank {rank} went on: it is now in {_where(run, now[0])}")
    seq, stretch = _origin(run, rank, seqs, where.seq, evidence)
    return Finding(kind="skipped_collective", culprit_ranks=[rank], group=group.name, group_desc=group.desc,
                   seq=seq, seq_range=stretch, expected=run.describe(expected), waiting_ranks=waiting, in_flight=True,
                   evidence=evidence)


# -- ranks that disagree on whether a collective completed ------------------------------------------
def _state_findings(run: _Run, disagreements: list[Disagreement]) -> list[Finding]:
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
                    seq=seq, expected="completed", actual={str(r): ("scheduled", "started", "completed")[s]
                                                           for r, s in states.items()},
                    evidence=[f"rank(s) {moved_on} went on to later collectives of {seqs.group.label} without "
                              f"completing #{seq}, which their peers completed"]))
                break
    return findings


def _straggler_finding(straggler, run: _Run) -> Finding:
    return Finding(kind="straggler", culprit_ranks=[straggler.rank], evidence=[
        f"arrives {straggler.median_lateness_ns / 1e6:.1f} ms after its peers' median (threshold "
        f"{straggler.threshold_ns / 1e6:.1f} ms: the floor, the other ranks' noise and the clock error) in "
        f"{straggler.collectives} collectives, last in {straggler.last_share:.0%}, from {straggler.source}"])


# -- 4. the root cause first -------------------------------------------------------------------------
def _rooted(findings: list[Finding]) -> list[Finding]:
    """The finding with direct evidence that explains the most blocked ranks first (then the most
    specific kind, then the oldest); the findings whose culprits it blocks become its consequences."""
    order = {kind: i for i, kind in enumerate(KINDS)}
    findings = sorted(findings, key=lambda f: (f.inferred, -len(f.waiting_ranks), not f.culprit_ranks, order[f.kind],
                                               f.seq if f.seq is not None else 0))
    if not findings:
        return findings
    root, rest = findings[0], findings[1:]
    blocked = set(root.waiting_ranks) | set(root.culprit_ranks)
    consequences = [f for f in rest if f.culprit_ranks and set(f.culprit_ranks) <= blocked]
    root.explains = [f.headline() for f in consequences]
    return [root] + [f for f in rest if f not in consequences] + consequences
