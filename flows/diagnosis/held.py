"""Devices that stopped: where a rank others wait for is held, when its own entries show no one
to wait for.

NCCL marks an entry started when its kernel starts on the device. A rank whose peers started a
call (or the counterpart of a transfer) and wait inside, while its own oldest unfinished entry is
that very call, enqueued but never started, with everything before it completed, has a stream
held by work the Flight Recorder does not record: ``not_started``. A group whose every member
started a call that none completed, with others waiting for it, is stuck below the Flight
Recorder: ``stalled_collective``. A device behind on an earlier entry than the one its peers wait
in is not named: a dump taken while the job runs normally looks the same (it is computing).
"""

from __future__ import annotations

import numpy as np

from rankstream.flows.diagnosis.findings import Finding, ranks_text
from rankstream.flows.diagnosis.run import Run
from rankstream.flows.diagnosis.waits import Edge, Position, WaitGraph

__all__ = ["held_devices"]


def held_devices(run: Run, graph: WaitGraph, settled: set[int]) -> list[Finding]:
    """The ranks others wait for only because their devices have not started a call (behind),
    whose own entries show no one to wait for. Where each stopped is its oldest unfinished entry:
    one a peer started and waits in, not started by the rank although everything before it
    completed (``not_started``: its stream is held by work the Flight Recorder does not record), or
    a collective every member of its group started and none completed (``stalled_collective``).
    One finding per call."""
    unstarted: dict[Position, list[int]] = {}
    inside: set[Position] = set()
    for sink in graph.sinks():
        behind = [e for e in graph.into(sink) if e.how == "behind"]
        row = _oldest_unfinished(run, sink) if sink not in settled and behind else None
        if row is None:
            continue
        entries = run.entries
        group, state = int(entries.group[row]), int(entries.state[row])
        seq = -int(entries.p2p_seq[row]) if entries.is_p2p[row] else int(entries.seq[row])
        if state == 0 and _waited_in(run, sink, behind, group, seq):
            unstarted.setdefault(Position(-1, group, seq), []).append(sink)
        elif state == 1 and seq > 0 and _all_inside(run, group, seq):
            inside.add(Position(-1, group, seq))
    return ([_not_started(run, graph, where, ranks) for where, ranks in unstarted.items()]
            + [_stalled(run, graph, where) for where in sorted(inside, key=lambda p: (p.group, p.seq))])


def _waited_in(run: Run, rank: int, behind: list[Edge], group: int, seq: int) -> bool:
    """Whether a peer started the very call (or the counterpart of the very transfer) that is the
    rank's oldest unfinished entry. A device that is behind on an earlier entry than the one its
    peers wait in looks the same in a dump taken while the job runs normally (it is computing)."""
    if seq > 0:
        return any((e.waiter.group, e.waiter.seq) == (group, seq) for e in behind)
    return any(b.waiter == rank and (b.group, b.p2p_seq) == (group, -seq) for _, b in run.p2p.behind)


def _oldest_unfinished(run: Run, rank: int) -> int | None:
    """The row of the rank's oldest unfinished entry of any kind (collective or p2p)."""
    entries = run.entries
    rows = np.flatnonzero((entries.rank == rank) & (entries.state < 2))
    return int(rows[np.argmin(entries.record[rows])]) if len(rows) else None


def _all_inside(run: Run, group: int, seq: int) -> bool:
    """Whether every member of the group started call ``seq`` and none completed it."""
    seqs = run.sequences.get(group)
    if seqs is None:
        return False
    states = seqs.states_at(seq)
    members = seqs.group.members
    return all(states.get(m) == 1 for m in members) and not set(members) & run.stateless


def _stalled(run: Run, graph: WaitGraph, where: Position) -> Finding:
    seqs = run.sequences[where.group]
    members = list(seqs.group.members)
    return Finding(
        kind="stalled_collective", culprit_ranks=members, group=seqs.group.name, group_desc=seqs.group.desc,
        seq=where.seq, expected=run.describe(seqs.usual_at(where.seq)), actual=run.describe(seqs.usual_at(where.seq)),
        waiting_ranks=sorted(graph.upstream(set(members))), in_flight=True, evidence=[
            f"every member of {seqs.group.label} ({ranks_text(members)}) started #{where.seq} and none completed it",
            "nothing in the Flight Recorder shows a member missing, behind or at odds: the fault is below it (the "
            "network, NCCL, or a device)"])


def _not_started(run: Run, graph: WaitGraph, where: Position, ranks: list[int]) -> Finding:
    """Ranks whose devices never started the oldest entry they enqueued and did not finish."""
    group = run.group(where.group)
    they = ranks_text(ranks)
    if where.seq > 0:
        seqs = run.sequences[where.group]
        inside = sorted(rank for rank, state in seqs.states_at(where.seq).items() if state == 1)
        call = run.describe(seqs.values_at(where.seq)[ranks[0]])
        place = f"#{where.seq} of {group.label}"
    else:
        inside, call = _transfer_of(run, ranks[0], where)
        place = f"p2p #{-where.seq} of {group.label}"
    waiting = sorted(graph.upstream(set(ranks)))
    evidence = [f"{they} enqueued {place} but " + ("its device never started it" if len(ranks) == 1 else
                                                   "their devices never started it")
                + f", and everything enqueued before it completed: the stream is held by work the Flight Recorder "
                "does not record (a kernel that does not finish, a wait on another stream)"]
    if inside:
        evidence.append(f"{ranks_text(inside)} started {'it' if where.seq > 0 else 'its counterpart'} and wait"
                        + ("s" if len(inside) == 1 else "") + " inside")
    evidence.append("a dump taken while the job ran normally can catch a device a moment behind; the live watch "
                    "records this only once the ranks stopped making progress")
    return Finding(kind="not_started", culprit_ranks=sorted(ranks), group=group.name, group_desc=group.desc,
                   seq=abs(where.seq), expected=call, actual=call, waiting_ranks=waiting, in_flight=True,
                   evidence=evidence)


def _transfer_of(run: Run, rank: int, where: Position) -> tuple[list[int], dict]:
    """The ranks whose started transfer waits for the rank's send or receive at ``where``, and
    that send or receive described."""
    entries, vocab = run.entries, run.entries.vocabulary
    row = int(np.flatnonzero((entries.rank == rank) & entries.is_p2p & (entries.group == where.group)
                             & (entries.p2p_seq == -where.seq))[0])
    waiting = sorted({w.waiter for w, b in run.p2p.behind if b.waiter == rank and b.p2p_seq == -where.seq})
    return waiting, {"op": vocab.ops[entries.op[row]], "peer": int(entries.peer[row]),
                     "shape": vocab.text("shapes", entries.shape[row]), "dtype": vocab.text("dtypes", entries.dtype[row])}
