"""Hang findings: what the wait-for graph says about who is at fault.

In order: ranks stuck in a collective their peers completed; ranks waiting in a call the job does
not issue there (an extra collective); devices that stopped (``held``: one that never started
the call a peer waits in, or a group inside a call none completes); ranks others wait for that
went past the call (skipped it) or left no dump; the remaining sinks (a rank that never issued
the call, with nothing to show where it went); cycles no sink explains (deadlocks).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from rankstream.flows.diagnosis.evidence import siblings_of
from rankstream.flows.diagnosis.findings import Finding, ranks_text
from rankstream.flows.diagnosis.held import held_devices
from rankstream.flows.diagnosis.matching import Disagreement
from rankstream.flows.diagnosis.origin import shift_origin
from rankstream.flows.diagnosis.own_program import passed_in_program
from rankstream.flows.diagnosis.p2p import Mismatch
from rankstream.flows.diagnosis.program_order import completed_later, first_in_program
from rankstream.flows.diagnosis.run import Run, place_of
from rankstream.flows.diagnosis.sequences import GroupSequences, period_of
from rankstream.flows.diagnosis.waits import (Edge, Position, WaitGraph, build_wait_graph, came_early, gone_past,
                                              gone_past_first_call, gone_past_transfer, late_for, program_between,
                                              transfer_out_of_program, waiting_positions)

__all__ = ["wait_graph", "hang_findings", "WENT_NOWHERE", "STALLED_OUTSIDE"]

#: How the evidence line begins that guesses where a rank went when nothing shows it (a rank known
#: to have died went nowhere: the line is dropped then).
WENT_NOWHERE = "nothing shows where rank"
#: How the evidence of a rank whose live stack is in its own code begins (a dead rank's drops it).
STALLED_OUTSIDE = "the live stack shows rank"


def wait_graph(run: Run) -> WaitGraph:
    positions = waiting_positions(run.calls, run.stateless, in_transfer=_in_transfer(run))
    graph = build_wait_graph(positions, run.sequences, run.dumped, stateless=run.stateless,
                             rooted=_rooted_values(run))
    in_call = _in_call(run)
    for gap in run.p2p.unmatched:
        if not gap.started and in_call.get(gap.waiter, gap.record) < gap.record:
            continue  # queued behind a call its device is inside: it waits there, not for this peer
        position = Position(gap.waiter, gap.group, -gap.p2p_seq)  # a negative seq marks a p2p position
        graph.waiting.append(position)
        graph.add(Edge(position, gap.peer, "absent"))
    for waiting, behind in run.p2p.behind:
        position = Position(waiting.waiter, waiting.group, -waiting.p2p_seq)
        graph.waiting.append(position)
        graph.add(Edge(position, behind.waiter, "behind"))
    return graph


#: Collectives in which a rank can complete before every member joined (a broadcast's root, a
#: reduce's senders: small messages fit in the receivers' buffers).
ROOTED_OPS = frozenset({"broadcast", "reduce", "scatter", "gather", "_reduce_oop", "_broadcast_oop"})


def _rooted_values(run: Run) -> set[int]:
    """The call values (``Calls.value``) whose op is rooted, coalesced ones included."""
    ops = run.entries.vocabulary.ops
    rooted = {code for code, op in enumerate(ops) if any(part.strip("()") in ROOTED_OPS
                                                         for part in op.replace("coalesced(", "").split(","))}
    return {value for value, (op, _, _) in enumerate(run.calls.parts.tolist()) if op in rooted}


def _in_call(run: Run) -> dict[int, int]:
    """rank -> the record of its oldest started, unfinished entry that is not a send or receive (a
    collective, or the close that carries a batch of transfers' state)."""
    entries = run.entries
    return _oldest_started(run, ~entries.is_p2p | (entries.peer < 0))


def _in_transfer(run: Run) -> dict[int, int]:
    """rank -> the record of its oldest started, unfinished send or receive."""
    return _oldest_started(run, run.entries.is_p2p)


def _oldest_started(run: Run, kind: np.ndarray) -> dict[int, int]:
    """rank -> the record of its oldest started, unfinished entry among the rows ``kind`` marks."""
    entries = run.entries
    rows = np.flatnonzero(kind & (entries.state == 1))
    found: dict[int, int] = {}
    for rank, record in zip(entries.rank[rows].tolist(), entries.record[rows].tolist()):
        found[rank] = min(record, found.get(rank, record))
    return found


def hang_findings(run: Run, graph: WaitGraph, disagreements: list[Disagreement]) -> list[Finding]:
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
    held = held_devices(run, graph, settled)  # a stuck device explains the calls its rank issued no more
    findings += held
    settled |= {rank for finding in held for rank in finding.culprit_ranks}
    passed = _gone_past(run, graph, settled)
    for cycle in graph.cycles():  # two or more ranks that each went past a call: a deadlock
        if len(set(cycle) & set(passed)) >= 2:
            for rank in cycle:
                passed.pop(rank, None)
    for rank in sorted(passed):
        findings.append(_absent(run, graph, rank, passed[rank]))
    settled |= set(passed)
    late = _late(run, graph, settled)
    for rank in sorted(late):
        findings.append(_skipped_earlier(run, graph, rank, late[rank]))
    settled |= set(late)
    findings += _sinks(run, graph, settled)
    for mismatch in run.p2p.mismatched:
        findings.append(_p2p_mismatch(run, mismatch))
        settled |= {mismatch.send.waiter, mismatch.recv.waiter}
    reaching = graph.upstream(settled) | settled
    for cycle in graph.cycles():
        if set(cycle) & reaching:
            continue
        edges = [edge for rank in cycle for edge in graph.edges[rank] if edge.target in cycle]
        reversed_order = (_out_of_order(run, cycle, [edge.waiter for edge in edges], graph=graph)
                          or _transfers_out_of_order(run, graph, cycle, edges))
        if reversed_order is not None:
            findings.append(reversed_order)
            continue
        first = edges[0].waiter
        findings.append(Finding(
            kind="deadlock", culprit_ranks=cycle, group=run.group(first.group).name,
            group_desc=run.group(first.group).desc, seq=first.seq if first.seq > 0 else None,
            waiting_ranks=sorted(graph.upstream(set(cycle))), in_flight=True,
            evidence=[f"rank {e.waiter.rank} waits in {place_of(run, e.waiter)} for rank {e.target}" for e in edges]))
    return findings


def _sinks(run: Run, graph: WaitGraph, settled: set[int]) -> list[Finding]:
    """The remaining ranks others wait for in a call they never issued, with nothing to show that
    they went past it (it is settled here). Their live stacks (``published_stacks``), where
    current, say more: a rank blocked in a point-to-point call waits for a peer (when one other
    such rank is outside communication, that one leads, and the blocked ones only wait for it); a
    rank inside the collective before the one its peers wait in is stuck in it (gloo never marks an
    entry completed)."""
    found, where = {}, {}
    for sink in graph.sinks():  # only a rank that never issued a call is a root; one enqueued behind
        absent = [e for e in graph.into(sink) if e.how == "absent"]
        if sink not in settled and absent:  # is elsewhere
            found[sink] = _absent(run, graph, sink, absent, found_at_fault=settled)
            where[sink] = first_in_program(run, absent).waiter
            settled.add(sink)
    unrecorded = {sink: finding for sink, finding in found.items() if finding.kind == "skipped_collective"}
    blocked = {sink: run.blocked_in[sink] for sink in unrecorded if sink in run.blocked_in}
    for sink, finding in unrecorded.items():  # nothing shows it went past: it may be blocked in a call
        finding.inferred = True  # ranked after the findings with direct evidence
        if sink in blocked and blocked[sink].point_to_point:
            finding.actual = {"blocked_in": str(blocked[sink])}
            finding.evidence.append(f"rank {sink}'s live stack shows it blocked in {blocked[sink]}, a "
                                    "point-to-point call the Flight Recorder does not record with gloo: it waits "
                                    "for a peer")
        elif sink in blocked:
            finding.evidence.append(f"rank {sink}'s live stack shows it inside {blocked[sink]}")
        elif sink in run.outside_communication and _short_of(run, finding, where[sink]):
            place = run.outside_communication[sink]
            finding.actual = {"stalled_at": str(place)}
            finding.evidence.append(f"{STALLED_OUTSIDE} {sink} at {place}, outside communication: it has not "
                                    "reached the call")
        else:
            finding.evidence.append(f"{WENT_NOWHERE} {sink} went instead: it is stalled outside "
                                    "collectives or blocked in a call the Flight Recorder does not record "
                                    "(gloo's send/recv)")
    for sink, call in blocked.items():  # waiting for a peer that is in a collective: that peer went on without it
        peer_at = _peer_elsewhere(run, graph, call, unrecorded)
        if peer_at is not None:
            found.pop(sink)
            found[peer_at.rank] = _transfer_never_posted(run, graph, sink, call, peer_at)
            where[peer_at.rank] = peer_at
    waiting_on_peers = [sink for sink, call in blocked.items() if call.point_to_point and sink in found]
    free = [sink for sink in unrecorded if sink not in blocked]
    if waiting_on_peers and len(free) == 1:
        lead = unrecorded[free[0]]
        lead.waiting_ranks = sorted(set(lead.waiting_ranks) | set(waiting_on_peers))
        for sink in waiting_on_peers:  # explained by the lead: not a root cause of their own
            lead.evidence.append(f"rank {sink}, blocked in {blocked[sink]}, waits for rank {free[0]}: no other rank "
                                 "absent from this call is outside communication")
            found.pop(sink)
    inside = _still_inside(run, {sink: where[sink] for sink, call in blocked.items() if not call.point_to_point},
                           blocked)
    for (code, seq), ranks in inside.items():
        for rank in ranks:
            found.pop(rank)
        found[min(ranks)] = _stuck_in_previous(run, graph, code, seq, ranks, blocked)
    return _one_per_call(run, list(found.values()), where)


def _peer_elsewhere(run: Run, graph: WaitGraph, call, unrecorded: dict) -> Position | None:
    """Where the peer of a point-to-point call waits, when the stack named the peer and the peer
    left data, is itself no rank that others wait for in vain, and waits in a collective."""
    peer = call.peer if call.point_to_point else None
    if peer is None or peer in unrecorded or peer not in run.dumped:
        return None
    return next((p for p in graph.waiting if p.rank == peer), None)


def _transfer_never_posted(run: Run, graph: WaitGraph, sink: int, call, peer_at: Position) -> Finding:
    """A rank blocked in a receive (or send) whose peer went on to a collective instead: the peer
    never posted its send (or receive), and everyone waiting for the blocked rank waits for it."""
    peer = peer_at.rank
    op = "send" if call.function.startswith("recv") else "recv"
    waiting = sorted((graph.upstream({sink}) | {sink}) - {peer})
    return Finding(kind="p2p_unmatched", culprit_ranks=[peer], expected={"op": op, "peer": sink},
                   waiting_ranks=waiting, in_flight=True, evidence=[
                       f"rank {sink}'s live stack shows it blocked in {call}: gloo's Flight Recorder records no "
                       "send or receive, so only its stack says whom it waits for",
                       f"rank {peer} went on to {place_of(run, peer_at)} instead of posting its {op}"])


def _one_per_call(run: Run, findings: list[Finding], where: dict[int, Position]) -> list[Finding]:
    """Ranks without a dump that the same ranks wait for in the same call are one finding (a node
    that went down takes all its ranks with it: one cause, not one per rank). ``where``: the call
    each culprit's waiters wait in first."""
    kept: list[Finding] = []
    first_of: dict[tuple, Finding] = {}
    for finding in findings:
        key = (finding.group, finding.seq, tuple(finding.waiting_ranks), repr(finding.expected))
        collective = finding.kind == "missing_dump" and "peer" not in (finding.expected or {})  # not a transfer
        first = first_of.get(key) if collective else None
        if first is None:
            if collective:
                first_of[key] = finding
            kept.append(finding)
            continue
        first.culprit_ranks = sorted(first.culprit_ranks + finding.culprit_ranks)
        first.evidence[0] = _no_dump_line(run, first.culprit_ranks, first.waiting_ranks,
                                          where[first.culprit_ranks[0]])
    return kept


def _short_of(run: Run, finding: Finding, waited_at: Position) -> bool:
    """Whether the finding is about the very call its peers wait in, by a rank whose own entries
    show it never went past it: not a call that the rank's program left earlier (``seq_range``, a
    moved ``seq``), nor a rank without a dump that its peers saw in a later call."""
    return finding.seq == waited_at.seq and finding.seq_range is None and finding.culprit_ranks[0] in run.dumped


def _still_inside(run: Run, waited_at: dict[int, Position], blocked: dict) -> dict[tuple[int, int], list[int]]:
    """(group code, seq) -> the ranks whose live stack shows them inside that call, the one before
    the call their peers wait in, as their last entry of the group says (same function)."""
    inside: dict[tuple[int, int], list[int]] = {}
    for rank, position in sorted(waited_at.items()):
        seqs = run.sequences[position.group]
        last = seqs.last_seq().get(rank)
        value = seqs.values_at(last).get(rank) if last is not None else None
        described = run.describe(value) or {}
        if last == position.seq - 1 and _same_function(described.get("op"), blocked[rank].function):
            inside.setdefault((position.group, last), []).append(rank)
    return inside


def _same_function(op: str | None, function: str) -> bool:
    """Whether a Flight Recorder op (``broadcast``, ``allreduce``, ``_allgather_base``) is what the
    ``torch.distributed`` function of that name issues (``broadcast``, ``all_reduce``, ``all_gather_into_tensor``)."""
    if not op:
        return False
    plain = op.replace("_", "").replace("base", "")
    name = function.replace("_", "").replace("intotensor", "").replace("tensor", "").replace("single", "")
    return bool(plain) and (plain in name or name in plain)


def _stuck_in_previous(run: Run, graph: WaitGraph, code: int, seq: int, ranks: list[int], blocked: dict) -> Finding:
    """Ranks still inside a call their peers went past. When their stacks name different roots,
    they disagree on the call's root, and the finding says so; which of them is wrong cannot be
    told from the ranks inside alone (a rank naming itself and one naming a root that went past
    look alike whichever of the two erred), so all of them are named."""
    seqs = run.sequences[code]
    value = seqs.values_at(seq)[ranks[0]]
    past = sorted(rank for rank, last in seqs.last_seq().items() if last > seq and rank not in ranks)
    roots = {rank: blocked[rank].root for rank in ranks}
    described = run.describe(value)
    actual = described
    evidence = [f"rank {rank}'s live stack shows it inside {blocked[rank]}, its last call of {seqs.group.label} "
                f"(#{seq})" for rank in ranks]
    if None not in roots.values() and len(set(roots.values())) > 1:
        actual = {**described, "roots": {str(rank): root for rank, root in roots.items()}}
        evidence.append("their stacks name different roots: "
                        + ", ".join(f"rank {rank} root {root}" for rank, root in roots.items()))
    return Finding(
        kind="stuck_in_collective", culprit_ranks=ranks, group=seqs.group.name, group_desc=seqs.group.desc,
        seq=seq, expected=described, actual=actual,
        waiting_ranks=sorted(graph.upstream(set(ranks)) - set(ranks)), in_flight=True,
        evidence=evidence + [f"{ranks_text(past)} went past #{seq}: for them it completed (gloo marks no entry "
                             "completed)"])


def _out_of_order(run: Run, cycle: list[int], positions: list[Position], *, graph: WaitGraph) -> Finding | None:
    """A deadlock that one side caused: ranks of the cycle that issued two of its calls (in two
    groups) in the reverse of the order a strict majority of the groups' common members issued
    them. A rank that issued only one of the two is taken to reach the other later. When the order
    splits evenly (two ranks, one each way), the side that issued its first call of the two early
    by its own program (``came_early``) changed it: it swapped the two calls, or, if it never
    issued the other one, skipped that one (a ``skipped_collective``). None when nothing tells them
    apart (every rank reached its calls as its program does: a deadlock by design)."""
    calls = run.calls
    places = sorted({(p.group, p.seq) for p in positions if p.seq > 0})
    records: dict[tuple[int, int], dict[int, int]] = {}

    def record_of(place: tuple[int, int]) -> dict[int, int]:
        if place not in records:
            rows = np.flatnonzero((calls.group == place[0]) & (calls.seq == place[1]))
            records[place] = dict(zip(calls.rank[rows].tolist(), calls.record[rows].tolist()))
        return records[place]

    def first_first(rank: int, first: tuple[int, int], second: tuple[int, int]) -> bool | None:
        mine, theirs = record_of(first).get(rank), record_of(second).get(rank)
        if mine is None and theirs is None:
            return None
        return theirs is None or (mine is not None and mine < theirs)

    for first, second in ((a, b) for i, a in enumerate(places) for b in places[i + 1:] if a[0] != b[0]):
        common = set(run.group(first[0]).members) & set(run.group(second[0]).members)
        order = {rank: way for rank in common if (way := first_first(rank, first, second)) is not None}
        majority = Counter(order.values()).most_common(1)
        if not majority:
            continue
        by_majority = majority[0][1] * 2 > len(order)
        if by_majority:
            usual = majority[0][0]
        else:  # split evenly: each rank's own program says which of them changed its order
            changed = {rank for rank, way in order.items()
                       if came_early(calls, rank, call=first if way else second,
                                     other=_kind_at(run, second if way else first),
                                     from_start=run.starts_at_first_entry(rank),
                                     peers=[peer for peer, theirs in order.items() if theirs != way])}
            if not changed or len(changed) == len(order) or len({order[rank] for rank in changed}) > 1:
                continue
            usual = not order[next(iter(changed))]
        culprits = sorted(rank for rank, way in order.items() if way != usual and rank in cycle)
        if not culprits:
            continue
        before, after = (first, second) if usual else (second, first)  # the majority's order
        if not by_majority and all(record_of(before).get(rank) is None for rank in culprits):
            return _skipped_in_cycle(run, graph, cycle, culprits, skipped=before,
                                     evidence=_never_issued(run, culprits, skipped=before, issued=after))
        if by_majority:
            short = _one_call_short(run, culprits, [rank for rank, way in order.items() if way == usual],
                                    before=before, after=after)
            if short is not None:
                return _skipped_in_cycle(run, graph, cycle, culprits, skipped=before,
                                         evidence=_shifted(run, culprits, skipped=before, issued=after, counts=short))
        expected, actual = _usual_call(run, before), _usual_call(run, after)
        if not by_majority:
            expected["order_of"] = "its own program's"
        return Finding(
            kind="order_mismatch", culprit_ranks=culprits, group=run.group(before[0]).name,
            group_desc=run.group(before[0]).desc, seq=before[1], expected=expected, actual=actual,
            waiting_ranks=_held_by(graph, cycle, culprits), in_flight=True,
            evidence=[f"{ranks_text(culprits)} issued {actual['call']} before {expected['call']}; "
                      + (f"{len(order) - len(culprits)} of the {len(order)} ranks in both groups issue them the "
                         "other way round" if by_majority else
                         f"since its previous call of {run.group(after[0]).label} it issued fewer calls of "
                         f"{run.group(before[0]).label} than its own program always did, and its peer kept to its "
                         "program")
                      + ", so each side waits for the other (deadlock)"])
    return None


def _transfers_out_of_order(run: Run, graph: WaitGraph, cycle: list[int], edges: list[Edge]) -> Finding | None:
    """A cycle of ranks each waiting in a send or receive the other never posted at that number:
    the ranks whose transfer there is not the one their own program has at that place of its period
    (``transfer_out_of_program``) posted their transfers out of order. None when all or none did."""
    if not edges or any(edge.waiter.seq >= 0 for edge in edges):
        return None
    waits = {edge.waiter.rank: edge.waiter for edge in edges}
    culprits = sorted(rank for rank, where in waits.items()
                      if transfer_out_of_program(run.entries, rank, group=where.group, number=-where.seq))
    if not culprits or len(culprits) == len(waits):
        return None
    where = waits[culprits[0]]
    group = run.group(where.group)
    rows = np.flatnonzero(run.entries.is_p2p & (run.entries.rank == where.rank) & (run.entries.group == where.group)
                          & (run.entries.p2p_seq == -where.seq))
    op = run.entries.vocabulary.ops[int(run.entries.op[rows[0]])]
    peer = int(run.entries.peer[rows[0]])
    other = "send" if op == "recv" else "recv"
    way = "from" if op == "recv" else "to"
    return Finding(
        kind="order_mismatch", culprit_ranks=culprits, group=group.name, group_desc=group.desc, seq=None,
        expected={"op": other, "order_of": "its own program's"},
        actual={"op": op, "peer": peer, "call": f"{op} {way} rank {peer} (p2p #{-where.seq} of {group.label})"},
        waiting_ranks=_held_by(graph, cycle, culprits), in_flight=True,
        evidence=[f"{ranks_text(culprits)} posted a {op} {way} rank {peer} as p2p #{-where.seq} of {group.label}, "
                  f"where every earlier period of its own program posts another transfer first; its peer kept to "
                  "its program, so each side waits for the other (deadlock)"])


def _skipped_in_cycle(run: Run, graph: WaitGraph, cycle: list[int], culprits: list[int], *,
                      skipped: tuple[int, int], evidence: list[str]) -> Finding:
    """Ranks of a two-sided cycle that skipped one of several alike calls (``evidence`` says how
    it shows)."""
    group = run.group(skipped[0])
    return Finding(
        kind="skipped_collective", culprit_ranks=culprits, group=group.name, group_desc=group.desc, seq=skipped[1],
        expected=run.describe(run.sequences[skipped[0]].usual_at(skipped[1])),
        waiting_ranks=_held_by(graph, cycle, culprits), in_flight=True, evidence=evidence)


def _never_issued(run: Run, culprits: list[int], *, skipped: tuple[int, int], issued: tuple[int, int]) -> list[str]:
    """The culprits never issued the call their peer waits in, and issued the call they wait in
    early by their own program."""
    return [f"{ranks_text(culprits)} never issued {_usual_call(run, skipped)['call']} and went on to "
            f"{_usual_call(run, issued)['call']} after fewer calls of {run.group(skipped[0]).label} than its own "
            "program always issues there: it skipped one of them"]


def _one_call_short(run: Run, culprits: list[int], peers: list[int], *, before: tuple[int, int],
                    after: tuple[int, int]) -> tuple[int, int] | None:
    """(the culprits' last number, their peers') in the group of ``before`` when the culprits,
    having issued ``after`` before ``before``, went on issuing calls of that group and ended one
    call short of their peers, with as many calls of the other group as they: every later call is
    one number behind, a skip and not a swap (a swap ends even). Visible where the hosts ran ahead
    of their devices to the end of the record (NCCL); None otherwise."""
    last, other = run.sequences[before[0]].last_seq(), run.sequences[after[0]].last_seq()
    theirs = {(last.get(peer, 0), other.get(peer, 0)) for peer in peers}
    if len(theirs) != 1:
        return None
    (their_count, their_other), = theirs
    if all(last.get(rank, 0) == their_count - 1 > before[1] and other.get(rank, 0) == their_other
           for rank in culprits):
        return their_count - 1, their_count
    return None


def _shifted(run: Run, culprits: list[int], *, skipped: tuple[int, int], issued: tuple[int, int],
             counts: tuple[int, int]) -> list[str]:
    """The culprits' pair of calls is reversed and every later call of the group one number
    behind: they ended one call short."""
    label = run.group(skipped[0]).label
    return [f"{ranks_text(culprits)} issued {_usual_call(run, issued)['call']} before "
            f"{_usual_call(run, skipped)['call']}, the reverse of its peers' order, so each side waits for the "
            "other (deadlock)",
            f"it went on issuing calls of {label} and ended with {counts[0]} of them where its peers issued "
            f"{counts[1]}, with as many calls of {run.group(issued[0]).label} as they: every call from "
            f"#{skipped[1]} on is one number behind theirs, so it skipped one (a swap ends even)"]


def _held_by(graph: WaitGraph, cycle: list[int], culprits: list[int]) -> list[int]:
    """The ranks a cycle's culprits hold up: the rest of the cycle and every rank waiting on it."""
    return sorted((graph.upstream(set(cycle)) | set(cycle)) - set(culprits))


def _kind_at(run: Run, place: tuple[int, int]) -> tuple[int, int]:
    """(group, op) of the call most members issued at a (group, seq)."""
    value = run.sequences[place[0]].usual_at(place[1])
    return place[0], (run.calls.unpack(value)[0] if value is not None else -1)


def _usual_call(run: Run, place: tuple[int, int]) -> dict:
    """The call most members issued at a (group, seq), described, with its words in ``call``."""
    group, seq = place
    described = run.describe(run.sequences[group].usual_at(seq)) or {}
    return {**described, "call": f"{described.get('op', 'call')} #{seq} of {run.group(group).label}"}


def _legitimate(run: Run, position: Position, values: dict[int, int]) -> bool:
    """Whether the call a rank waits in is one the job issues there: a sibling group issued the
    same call at that sequence number, or the group's earlier calls predict it; and, when nobody
    else ever got that far in the group, the rank's calls of the group line up with the program
    (a rank with an extra call earlier is one ahead of everybody). ``values``: rank -> the call
    each member issued there."""
    if position.seq < 0:
        return True
    seqs = run.sequences[position.group]
    value = values.get(position.rank)
    family = siblings_of(seqs, run.sequences)
    if any(value in s.values_at(position.seq).values() for s in family):
        return True
    predicted = seqs.predicted_before(position.seq)
    if predicted is not None and predicted != value:
        return False
    if family and len(values) == 1:
        peers = [m for m in seqs.group.members if m != position.rank and m in run.dumped]
        return shift_origin(run.calls, position.rank, position.group, peers=peers, before=position.seq,
                            roles=run.roles) is None
    return True


def _extra_callers(run: Run, graph: WaitGraph) -> dict[int, Position]:
    """Ranks waiting, for peers that never came, in a call the job does not issue there. Ranks
    waiting in the same call with the same value get one answer (a whole job can wait in it)."""
    found = {}
    values: dict[tuple[int, int], dict[int, int]] = {}
    answers: dict[tuple, bool] = {}
    for rank, edges in graph.edges.items():
        for edge in edges:
            if edge.how != "absent" or edge.target not in run.dumped:
                continue
            where = edge.waiter
            if where.seq < 0:
                continue  # a send or receive: legitimate
            place = (where.group, where.seq)
            if place not in values:
                values[place] = run.sequences[where.group].values_at(where.seq)
            here = values[place]
            key = (*place, here.get(where.rank), where.rank if len(here) == 1 else None)
            if key not in answers:
                answers[key] = _legitimate(run, where, here)
            if not answers[key]:
                found.setdefault(rank, where)
    return found


def _gone_past(run: Run, graph: WaitGraph, settled: set[int]) -> dict[int, list[Edge]]:
    """Absent ranks that went past the call they are waited in (they skipped it): rank -> edges.
    The answer depends on the call and the target, not on the waiter: it is worked out once for
    every rank waiting there (a whole job can wait for one rank)."""
    group_desc = {code: group.desc or group.name for code, group in run.groups.items()}
    references: dict[tuple[int, int], tuple[Counter, set[int]]] = {}  # the program there, and who lent it
    verdicts: dict[tuple, bool] = {}
    reach = _Reach(graph)
    mates: dict[int, set[int]] = {}  # rank -> the ranks it waits with in a cycle
    for cycle in graph.cycles():
        for rank in cycle:
            mates.setdefault(rank, set()).update(cycle)
    found: dict[int, list[Edge]] = {}
    for edges in graph.edges.values():
        for edge in edges:
            if edge.how != "absent" or edge.target not in run.dumped or edge.target in settled \
                    or edge.waiter.rank in settled:
                continue
            if edge.waiter.seq < 0:  # a send or receive the target never posted
                gap = _gap_of(run, edge)
                key = (edge.target, gap.waiter, gap.group, gap.op)
                if key not in verdicts:
                    verdicts[key] = gone_past_transfer(run.entries, edge.target, peer=gap.waiter, group=gap.group,
                                                       op="recv" if gap.op == "send" else "send")
                if verdicts[key] and reach.free_or_circular(edge):
                    found.setdefault(edge.target, []).append(edge)
                continue
            where = (edge.waiter.group, edge.waiter.seq)
            key = (*where, edge.target)
            if key not in verdicts:
                if where not in references:
                    references[where] = _program_between(run, group_desc, *where), _reached(run, *where)
                reference, examples = references[where]
                verdicts[key] = gone_past(edge, run.calls, group_desc, reference=reference,
                                          own_program=examples - {edge.target} <= mates.get(edge.target, set())) \
                    or _passed(run, edge) or gone_past_first_call(
                        edge, run.calls, group_desc,
                        from_start=run.starts_at_first_entry(edge.target) and run.starts_at_first_entry(edge.waiter.rank))
            if verdicts[key]:
                found.setdefault(edge.target, []).append(edge)
    return found


def _late(run: Run, graph: WaitGraph, settled: set[int]) -> dict[int, list[Edge]]:
    """Behind ranks whose own call of the waited number comes after more calls than the program
    issues before it (they skipped the call their peers wait in): rank -> edges. Worked out once
    per call and target, as in ``_gone_past``."""
    verdicts: dict[tuple[int, int, int], bool] = {}
    places: dict[tuple[int, int, int], tuple[Counter, set[str], bool] | None] = {}
    reach = _Reach(graph)
    found: dict[int, list[Edge]] = {}
    for edges in graph.edges.values():
        for edge in edges:
            if edge.how != "behind" or edge.waiter.seq <= 1 or edge.target in settled or edge.waiter.rank in settled:
                continue
            key = (edge.waiter.group, edge.waiter.seq, edge.target)
            if key not in verdicts:
                same = places[key] = _same_place(run, *key)
                # a minority's example needs the rank's own too
                verdicts[key] = same is not None and (
                    late_for(edge, run.calls, run.roles, reference=same[0], played=same[1]) if same[2]
                    else _late_in_own_program(run, edge, places)) or _passed(run, edge)
            if verdicts[key] and reach.free_or_circular(edge):
                found.setdefault(edge.target, []).append(edge)
    for cycle in graph.cycles():
        late = set(cycle) & set(found)
        if len(late) > 1:  # late for each other: only a rank late against its own program too changed it
            for rank in late:
                if not any(_late_in_own_program(run, edge, places) or _passed(run, edge) for edge in found[rank]):
                    found.pop(rank)
    for cycle in graph.cycles():  # a rank that only swapped two calls is late too: the order finding says more
        if set(cycle) & set(found):
            swapped = _out_of_order(run, cycle, [e.waiter for r in cycle for e in graph.edges[r] if e.target in cycle],
                                    graph=graph)
            culprits = set(swapped.culprit_ranks) if swapped is not None else set()
            # the swapper late too: so is its peer behind the swap (late by a step that legitimately grew)
            for rank in cycle if culprits & set(found) else culprits:
                found.pop(rank, None)
    return found


def _passed(run: Run, edge: Edge) -> bool:
    """Whether the target reached the waited call late, or went past it, by its own program's
    calls and transfers (``own_program.passed_in_program``)."""
    return passed_in_program(run.entries, edge.target, group=edge.waiter.group, seq=edge.waiter.seq,
                             waiter=edge.waiter.rank, from_start=run.starts_at_first_entry(edge.target))


def _late_in_own_program(run: Run, edge: Edge, places: dict) -> bool:
    """``late_for`` against the target's own earlier calls of the group as well."""
    if places[edge.waiter.group, edge.waiter.seq, edge.target] is None:
        return False
    reference, played, _ = places[edge.waiter.group, edge.waiter.seq, edge.target]
    return late_for(edge, run.calls, run.roles, reference=reference, played=played, own_program=True,
                    from_start=run.starts_at_first_entry(edge.target))


def _same_place(run: Run, group: int, seq: int, target: int) -> tuple[Counter, set[str], bool] | None:
    """What the other members of a group (and its siblings) issued between its calls ``seq - 1`` and
    ``seq`` (the program at that very place, by role), the roles they play, and whether a majority
    of the members issued both (else the example is a minority's, a 2-rank group's peer alone).
    None when no other member issued both (nothing to compare with)."""
    seqs = run.sequences[group]
    both = set(seqs.values_at(seq)) & set(seqs.values_at(seq - 1)) - {target}
    if not both:
        return None
    family = [group] + [s.group.code for s in siblings_of(seqs, run.sequences)]
    played = {run.roles[code] for code in np.unique(run.calls.group[np.isin(run.calls.rank, list(both))]).tolist()}
    return (program_between(run.calls, run.roles, family, seq=seq, without=target), played,
            len(both) * 2 > len(seqs.group.members))


def _skipped_earlier(run: Run, graph: WaitGraph, rank: int, edges: list[Edge]) -> Finding:
    """A rank that skipped the call its peers wait in, and enqueued a later call under its number."""
    where = first_in_program(run, edges).waiter
    seqs = run.sequences[where.group]
    return Finding(
        kind="skipped_collective", culprit_ranks=[rank], group=seqs.group.name, group_desc=seqs.group.desc,
        seq=where.seq, expected=run.describe(seqs.usual_at(where.seq)), waiting_ranks=sorted(graph.upstream({rank})),
        in_flight=True, evidence=[
            f"its peers wait in #{where.seq} of {seqs.group.label}; rank {rank} enqueued its own #{where.seq} only "
            f"after calls of other groups that its peers issue after #{where.seq}: that is a later call, and it "
            f"skipped the one they wait in"])


class _Reach:
    """Whom a rank waits for, directly or through others, worked out once per rank."""

    def __init__(self, graph: WaitGraph) -> None:
        self.graph, self.known = graph, {}

    def waited_by(self, rank: int) -> set[int]:
        if rank not in self.known:
            seen, frontier = set(), [rank]
            while frontier:
                for target in self.graph.targets(frontier.pop()):
                    if target not in seen:
                        seen.add(target)
                        frontier.append(target)
            self.known[rank] = seen
        return self.known[rank]

    def free_or_circular(self, edge: Edge) -> bool:
        """Whether the target of ``edge`` waits for nobody, or only, through others, for the waiter.
        A rank held up by a third party never reached the call: what it did not issue there, or
        issued out of the usual order, is a consequence."""
        waits_for = self.waited_by(edge.target)
        return not waits_for or edge.waiter.rank in waits_for


def _gap_of(run: Run, edge: Edge):
    """The unfinished transfer a p2p ``absent`` edge stands for."""
    return next(g for g in run.p2p.unmatched if g.waiter == edge.waiter.rank and g.peer == edge.target
                and g.group == edge.waiter.group and g.p2p_seq == -edge.waiter.seq)


def _reached(run: Run, group: int, seq: int) -> set[int]:
    """The ranks of a group and its siblings that issued call ``seq``: the only ones whose stretch
    before it ``_program_between`` reads there (a sibling pair still short of it lends none)."""
    seqs = run.sequences[group]
    family = [group] + [s.group.code for s in siblings_of(seqs, run.sequences)]
    return set(run.calls.rank[np.isin(run.calls.group, family) & (run.calls.seq == seq)].tolist())


def _program_between(run: Run, group_desc: dict[int, str], group: int, seq: int) -> Counter:
    """What the job issues between calls ``seq - 1`` and ``seq`` of a group, from its members and
    its siblings, and from the same place one and two periods earlier (where only the rank at
    fault got as far as ``seq``, its own gap would be the only example)."""
    seqs = run.sequences[group]
    family = [group] + [s.group.code for s in siblings_of(seqs, run.sequences)]
    reference = program_between(run.calls, group_desc, family, seq=seq)
    period = period_of(seqs.consensus())
    for back in (period, 2 * period) if period else ():
        if seq - back > 1:
            reference |= program_between(run.calls, group_desc, family, seq=seq - back)
    return reference


def _stuck(run: Run, graph: WaitGraph, position: Position) -> Finding:
    seqs = run.sequences[position.group]
    value = seqs.values_at(position.seq)[position.rank]
    went_on = seqs.last_seq().get(position.rank, position.seq) > position.seq
    state = "started" if seqs.states_at(position.seq)[position.rank] else "scheduled"
    # stuck means inside it: a call its device never started, which its peers could not complete
    # without it, is a record that disagrees with theirs (a dump older than theirs, a missed start)
    stuck = state == "started" and not went_on
    return Finding(
        kind="stuck_in_collective" if stuck else "state_mismatch", culprit_ranks=[position.rank],
        group=seqs.group.name, group_desc=seqs.group.desc, seq=position.seq, expected=run.describe(value),
        actual=run.describe(value), waiting_ranks=sorted(graph.upstream({position.rank})), in_flight=True,
        evidence=[f"every other member of {seqs.group.label} that left a dump completed #{position.seq}; rank "
                  f"{position.rank}'s "
                  f"entry is still {state}"] + ([f"rank {position.rank} enqueued later calls of the group"]
                                                 if went_on else []))


def _extra(run: Run, graph: WaitGraph, rank: int, position: Position) -> Finding:
    """A rank waiting in a call the job does not issue there: an extra call, or, when it is the
    call the group's period has next, a skip of the one before it."""
    seqs = run.sequences[position.group]
    value = seqs.values_at(position.seq)[rank]
    absent = sorted(e.target for e in graph.edges[rank] if e.waiter == position)
    skipped = seqs.predicted_before(position.seq)
    if skipped is not None and skipped != value and seqs.predicted_before(position.seq, at=position.seq + 1) == value:
        # the call the group issues next: the rank skipped the one before it (the peer that took
        # its data in that one may have been aborted for it, and left no entry of its own there)
        return Finding(
            kind="skipped_collective", culprit_ranks=[rank], group=seqs.group.name, group_desc=seqs.group.desc,
            seq=position.seq, expected=run.describe(skipped), actual=run.describe(value),
            waiting_ranks=sorted(graph.upstream({rank})), in_flight=True, evidence=[
                f"rank {rank}'s #{position.seq} of {seqs.group.label} is {_short_call(run, value)}, which the "
                f"group's period has at #{position.seq + 1}; at #{position.seq} it has "
                f"{_short_call(run, skipped)}"])
    evidence = [f"rank {rank} waits in #{position.seq} of {seqs.group.label} for ranks {absent}, which never "
                "issued it", "no sibling group issued that call there, and the group's earlier calls do not "
                "predict it"]
    seq, stretch = _origin(run, rank, seqs, position.seq, evidence)
    return Finding(
        kind="extra_collective", culprit_ranks=[rank], group=seqs.group.name, group_desc=seqs.group.desc,
        seq=seq, seq_range=stretch, actual=run.describe(value), waiting_ranks=sorted(graph.upstream({rank})),
        in_flight=True, evidence=evidence)


def _short_call(run: Run, value: int) -> str:
    """``all_reduce of [[64, 64]]``."""
    described = run.describe(value) or {}
    return f"{described.get('op', 'a call')} of {described.get('shape')}"


def _origin(run: Run, rank: int, seqs: GroupSequences, hang_seq: int,
            evidence: list[str]) -> tuple[int, tuple[int, int] | None]:
    """Where the rank's shift began, when long before the hang (see ``origin``), and the stretch
    when its calls there are all alike (the dumps cannot tell which one it was)."""
    peers = [m for m in seqs.group.members if m != rank and m in run.dumped]
    stretch = shift_origin(run.calls, rank, seqs.group.code, peers=peers, before=hang_seq, roles=run.roles)
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


def _absent(run: Run, graph: WaitGraph, rank: int, edges: list[Edge], *,
            found_at_fault: set[int] = frozenset()) -> Finding:
    """A rank others wait for in a call it never issued: it skipped it, or left no dump. The ranks
    ``found_at_fault`` by direct evidence wait as a consequence of their own fault (one that skipped
    a call waits in the next for everyone): their waiting is not counted against this rank."""
    if not edges:
        edges = graph.into(rank)
    where = first_in_program(run, edges).waiter
    group = run.group(where.group)
    waiting = sorted(graph.upstream({rank}, passing=set(found_at_fault) - {rank}))
    if where.seq < 0:
        gap = next(g for g in run.p2p.unmatched if g.waiter == where.rank and g.peer == rank)
        kind = "p2p_unmatched" if rank in run.dumped else "missing_dump"
        now = [p for p in graph.waiting if p.rank == rank]
        return Finding(kind=kind, culprit_ranks=[rank], group=group.name, group_desc=group.desc, seq=-where.seq,
                       expected={"op": "recv" if gap.op == "send" else "send", "peer": gap.waiter},
                       waiting_ranks=waiting, in_flight=True,
                       evidence=[f"rank {gap.waiter}'s {gap.op} (p2p #{gap.p2p_seq} of {group.label}) has no "
                                 f"counterpart posted by rank {rank}"]
                       + ([f"rank {rank} went on: it is now in {place_of(run, now[0])}"] if now else []))
    seqs = run.sequences[where.group]
    expected = seqs.usual_at(where.seq)
    if rank not in run.dumped:
        later = completed_later(run, rank, where)
        if later is not None:  # it took part in a later call: it was alive and went past this one
            return Finding(kind="skipped_collective", culprit_ranks=[rank], group=group.name,
                           group_desc=group.desc, seq=where.seq, expected=run.describe(expected),
                           waiting_ranks=waiting, in_flight=True, evidence=[
                               f"rank {rank} left no dump, but its peers completed {later} with it, which comes "
                               f"after #{where.seq} of {group.label} in their program: it went past it"])
        # the ranks that left dumps disagree on that very call: their disagreement is the direct
        # evidence (a missing file cannot make them issue other calls), so it is ranked first
        disputed = len(set(seqs.values_at(where.seq).values())) > 1
        return Finding(kind="missing_dump", culprit_ranks=[rank], group=group.name, group_desc=group.desc,
                       seq=where.seq, expected=run.describe(expected), waiting_ranks=waiting, in_flight=True,
                       inferred=disputed,
                       evidence=[_no_dump_line(run, [rank], waiting, where)]
                       + ([f"the ranks that left dumps issued different calls at #{where.seq}"] if disputed else []))
    last = seqs.last_seq().get(rank)
    evidence = [f"rank {rank}'s last call in {group.label} is " + (f"#{last}" if last else "none") +
                f"; its peers wait in #{where.seq}"]
    now = [p for p in graph.waiting if p.rank == rank]
    if now:
        evidence.append(f"rank {rank} went on: it is now in {place_of(run, now[0])}")
    seq, stretch = _origin(run, rank, seqs, where.seq, evidence)
    return Finding(kind="skipped_collective", culprit_ranks=[rank], group=group.name, group_desc=group.desc,
                   seq=seq, seq_range=stretch, expected=run.describe(expected), waiting_ranks=waiting, in_flight=True,
                   evidence=evidence)


def _no_dump_line(run: Run, ranks: list[int], waiting: list[int], where: Position) -> str:
    them = "them" if len(ranks) > 1 else "it"
    return f"{ranks_text(ranks)} left no dump; {len(waiting)} rank(s) wait for {them}, first in {place_of(run, where)}"


def _p2p_mismatch(run: Run, mismatch: Mismatch) -> Finding:
    """A send and its receive that disagree on sizes or dtypes: both wait for good."""
    send, recv = mismatch.send, mismatch.recv
    vocab = run.entries.vocabulary

    def described(op) -> dict:
        return {"op": op.op, "shape": vocab.text("shapes", op.shape), "dtype": vocab.text("dtypes", op.dtype)}

    culprit = mismatch.culprit
    mine, other = (recv, send) if culprit == recv.waiter else (send, recv)
    culprits = [culprit] if culprit is not None else [send.waiter, recv.waiter]
    group = run.group(send.group)
    return Finding(
        kind=f"{mismatch.what}_mismatch", culprit_ranks=culprits,
        group=group.name, group_desc=group.desc, seq=mine.p2p_seq,
        expected={**described(other), "op": mine.op}, actual=described(mine),  # its op as its peer's data wants it
        waiting_ranks=[other.waiter] if culprit is not None else [], in_flight=True,
        culprit_reason=None if culprit is not None else "both sides differ from their last completed transfer",
        evidence=[f"rank {send.waiter}'s send (p2p #{send.p2p_seq} of {group.label}) and rank {recv.waiter}'s recv "
                  f"(p2p #{recv.p2p_seq}), paired in the order each posted them, differ in {mismatch.what}: "
                  f"{described(send)[_FIELD[mismatch.what]]} against {described(recv)[_FIELD[mismatch.what]]}; "
                  "neither completes"]
        + ([f"rank {other.waiter}'s side is what the last completed transfer between them used"]
           if culprit is not None else []))


_FIELD = {"size": "shape", "dtype": "dtype"}
