"""The wait-for graph: who is blocked, on whom, and where the waiting ends.

Where a rank is: with NCCL, inside its ``started`` entries (or, with timing off, its oldest
unfinished one); with gloo, whose entries all stay ``scheduled``, in its newest entry (a gloo
collective blocks the calling thread). Inside collective ``#n`` of group ``g`` it waits for every
member that has not started ``#n``: one that never issued it (an *absent* edge: it skipped it,
went elsewhere, or left no dump, unless a peer completed a call that is not rooted: then every
member joined it) and, with NCCL, one whose ``#n`` is only enqueued (a *behind* edge: its GPU is
still in something earlier). A rank whose own ``#n`` is only enqueued while a peer started it
waits for no one there: its device has not reached it.

Following the edges ends at a rank that waits for nobody (a sink: the root of a hang) or goes
round a cycle. A cycle is not always a deadlock: a rank that skipped a collective can go on to a
later one (the step's barrier) and wait there for the very peers that wait for it. What tells
them apart is program order: the rank that skipped has *gone past* the call it was waited in
(after its previous call in that group it issued more than the waiter issued before that call),
while in a deadlock each rank waits in a call it reached in order. A rank waited for in a send or
receive it never posted has gone past it when, since its last transfer of that kind with that
peer, it issued more collective calls than it ever issued between two of them, or when its last
period (between two calls of a collective that recurs, such as the step's last all_reduce) holds
fewer such transfers than every earlier one (a step that posts several alike sends). A rank waited for
in a call it did enqueue (behind) skipped it when it issued more calls than the program between
its previous call of the group and that one: its call of that number is a later one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from rankstream.flows.diagnosis.calls import Calls
from rankstream.flows.diagnosis.entries import Entries
from rankstream.flows.diagnosis.own_program import entries_in_order, in_issue_order
from rankstream.flows.diagnosis.sequences import GroupSequences

__all__ = ["Position", "Edge", "WaitGraph", "waiting_positions", "build_wait_graph", "gone_past", "program_between",
           "gone_past_transfer", "gone_past_first_call", "late_for", "came_early",
           "transfer_out_of_program"]

SCHEDULED, STARTED, COMPLETED = 0, 1, 2


@dataclass(frozen=True)
class Position:
    """Rank ``rank`` is inside call ``seq`` of group ``group`` (a group code); a negative ``seq``
    is a point-to-point position (``-p2p_seq``)."""

    rank: int
    group: int
    seq: int


@dataclass(frozen=True)
class Edge:
    waiter: Position
    target: int
    #: "absent" (the target never issued the call) or "behind" (it is enqueued but not started).
    how: str


@dataclass
class WaitGraph:
    edges: dict[int, list[Edge]] = field(default_factory=dict)
    #: Positions every member reached, with the same call, that every peer completed and this rank not.
    stuck: list[Position] = field(default_factory=list)
    #: Positions whose members all arrived but disagree (the matching names the culprit).
    disputed: list[Position] = field(default_factory=list)
    waiting: list[Position] = field(default_factory=list)

    def add(self, edge: Edge) -> None:
        self.edges.setdefault(edge.waiter.rank, []).append(edge)

    def targets(self, rank: int) -> set[int]:
        return {edge.target for edge in self.edges.get(rank, [])}

    def into(self, rank: int) -> list[Edge]:
        return [edge for edges in self.edges.values() for edge in edges if edge.target == rank]

    def upstream(self, ranks: set[int], *, passing: set[int] = frozenset()) -> set[int]:
        """Every rank whose waiting leads to one of ``ranks`` (not counting them), not through the
        waits of the ranks ``passing`` (they and what waits for them are left out)."""
        reverse: dict[int, set[int]] = {}
        for waiter, edges in self.edges.items():
            if waiter in passing:
                continue
            for edge in edges:
                reverse.setdefault(edge.target, set()).add(waiter)
        seen, frontier = set(), list(ranks)
        while frontier:
            for waiter in reverse.get(frontier.pop(), ()):
                if waiter not in seen and waiter not in ranks:
                    seen.add(waiter)
                    frontier.append(waiter)
        return seen

    def sinks(self) -> list[int]:
        """Ranks waited for that wait for nobody."""
        targets = {edge.target for edges in self.edges.values() for edge in edges}
        return sorted(t for t in targets if not self.edges.get(t))

    def cycles(self) -> list[list[int]]:
        """Groups of more than one rank that wait for each other (strongly connected components)."""
        order, seen = [], set()
        for start in sorted(self.edges):  # first pass: finishing order, iteratively
            if start in seen:
                continue
            seen.add(start)
            stack = [(start, iter(sorted(self.targets(start))))]
            while stack:
                node, children = stack[-1]
                child = next(children, None)
                if child is None:
                    stack.pop()
                    order.append(node)
                elif child not in seen:
                    seen.add(child)
                    stack.append((child, iter(sorted(self.targets(child)))))
        reverse: dict[int, set[int]] = {}
        for waiter in self.edges:
            for target in self.targets(waiter):
                reverse.setdefault(target, set()).add(waiter)
        assigned, components = set(), []
        for node in reversed(order):
            if node in assigned:
                continue
            component, frontier = [], [node]
            assigned.add(node)
            while frontier:
                current = frontier.pop()
                component.append(current)
                for previous in reverse.get(current, ()):
                    if previous not in assigned:
                        assigned.add(previous)
                        frontier.append(previous)
            if len(component) > 1:
                components.append(sorted(component))
        return components


def waiting_positions(calls: Calls, stateless: set[int], *, in_transfer: dict[int, int] | None = None) -> list[Position]:
    """Where each rank is (see the module docstring). ``in_transfer``: rank -> record of its oldest
    started send or receive; a rank with no started collective is not placed in an enqueued one
    that comes after it (its device is in the transfer)."""
    in_transfer = in_transfer or {}
    positions = []
    order = np.lexsort((calls.record, calls.rank))
    ranks = calls.rank[order]
    bounds = np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1], True]) if len(ranks) else np.zeros(1, np.int64)
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        rows = order[lo:hi]  # one rank's calls, oldest first
        rank = int(ranks[lo])
        if rank in stateless:
            chosen = rows[-1:]
        else:
            states = calls.state[rows]
            started = rows[states == STARTED]
            chosen = started if len(started) else rows[states < COMPLETED][:1]
            if not len(started) and rank in in_transfer:
                chosen = chosen[calls.record[chosen] < in_transfer[rank]]
        positions += [Position(rank, int(calls.group[r]), int(calls.seq[r])) for r in chosen.tolist()]
    return positions


def build_wait_graph(positions: list[Position], sequences: dict[int, GroupSequences], dumped: set[int],
                     *, stateless: set[int], rooted: set[int] = frozenset()) -> WaitGraph:
    """``rooted``: the call values of rooted collectives (a broadcast's root can complete alone)."""
    graph = WaitGraph()
    last = {code: seqs.last_seq() for code, seqs in sequences.items()}
    calls: dict[tuple[int, int], _Call] = {}  # what every rank waiting in one call shares, worked out once
    for position in positions:
        seqs = sequences.get(position.group)
        if seqs is None:
            continue
        key = (position.group, position.seq)
        if key not in calls:
            calls[key] = _Call.of(seqs, position.seq, last[position.group], dumped, stateless, rooted)
        call = calls[key]
        if call.states.get(position.rank) == SCHEDULED and call.started:
            continue  # its device has not started the call its peers started: it waits for no one there
        edges = [Edge(position, member, "absent") for member in call.absent if member != position.rank]
        if call.states.get(position.rank) == STARTED:
            edges += [Edge(position, member, "behind") for member in call.scheduled if member != position.rank]
        if edges:
            graph.waiting.append(position)
            for edge in edges:
                graph.add(edge)
        elif call.disputed:
            graph.waiting.append(position)
            graph.disputed.append(position)
        elif position.rank not in stateless and len(call.states) > 1 and call.unfinished <= {position.rank}:
            graph.stuck.append(position)
    return graph


@dataclass
class _Call:
    """One call of a group as every rank waiting in it sees it."""

    states: dict[int, int]
    #: Members that never issued it (or left no dump, unless a peer completed it: then every member
    #: took part), and members that issued it but did not start it.
    absent: list[int]
    scheduled: list[int]
    disputed: bool
    unfinished: set[int]
    #: Whether a member's device started it (NCCL with timing: an entry only enqueued is then behind).
    started: bool

    @classmethod
    def of(cls, seqs: GroupSequences, seq: int, reached: dict[int, int], dumped: set[int],
           stateless: set[int], rooted: set[int]) -> "_Call":
        states = seqs.states_at(seq)
        # a collective that is not rooted completes on a member only once every member joined
        completed = COMPLETED in states.values() and not set(seqs.values_at(seq).values()) & rooted
        absent = [m for m in seqs.group.members
                  if (m not in dumped and not completed) or (m in dumped and m not in states and reached.get(m, -1) < seq)]
        scheduled = [m for m in seqs.group.members
                     if m in states and m not in stateless and states[m] == SCHEDULED]
        return cls(states, absent, scheduled, len(set(seqs.values_at(seq).values())) > 1,
                   {rank for rank, state in states.items() if state < COMPLETED},
                   any(states.get(m) == STARTED for m in seqs.group.members if m not in stateless))


def program_between(calls: Calls, group_of: dict[int, str], groups: list[int], *, seq: int,
                    without: int | None = None) -> Counter:
    """What the job issues between call ``seq - 1`` and call ``seq`` of a group: per (group kind,
    op), the most any rank of ``groups`` (the group and its siblings) but ``without`` issued there.
    One pass over the calls for every rank at once (a rank at a time is ranks x calls)."""
    rows = np.flatnonzero(np.isin(calls.group, groups) & ((calls.seq == seq) | (calls.seq == seq - 1)))
    if not len(rows):
        return Counter()
    size = int(calls.rank.max()) + 1
    low = np.full(size, -1, dtype=np.int64)  # per rank, the record of its call seq - 1 (-1: none)
    high = np.full(size, -1, dtype=np.int64)  # and of its call seq
    before, here = rows[calls.seq[rows] == seq - 1], rows[calls.seq[rows] == seq]
    np.maximum.at(low, calls.rank[before], calls.record[before].astype(np.int64))
    high[calls.rank[here]] = calls.record[here]
    np.minimum.at(high, calls.rank[here], calls.record[here].astype(np.int64))
    if without is not None and without < size:
        high[without] = -1
    record = calls.record.astype(np.int64)
    between = np.flatnonzero((record > low[calls.rank]) & (record < high[calls.rank]) & (low[calls.rank] >= 0))
    if not len(between):
        return Counter()
    labels = sorted(set(group_of.values()))
    label_of = np.full(int(calls.group.max()) + 1, -1, dtype=np.int64)  # group code -> its kind's index
    for code, name in group_of.items():
        if code < len(label_of):
            label_of[code] = labels.index(name)
    ops = int(calls.op.max()) + 1
    keys, counts = np.unique((calls.rank[between].astype(np.int64) * len(labels) + label_of[calls.group[between]])
                             * ops + calls.op[between], return_counts=True)
    reference: Counter = Counter()
    for key, count in zip(keys.tolist(), counts.tolist()):
        rest, op = divmod(key, ops)
        kind = (labels[rest % len(labels)], op)
        reference[kind] = max(reference[kind], count)
    return reference


def gone_past(edge: Edge, calls: Calls, group_of: dict[int, str], *, reference: Counter,
              own_program: bool = False) -> bool:
    """Whether the absent target of ``edge`` went past the call its waiter waits in: after its own
    previous call in that group it issued calls of some kind more often than the job issues
    between that call and this one (``reference``, from ``program_between``). ``own_program``
    also asks for more than the target issued between any two of its own earlier calls of the
    group: when the only ranks the reference comes from wait in a cycle with the target, the
    reference is theirs alone and may be the fault's own gap."""
    group, seq = edge.waiter.group, edge.waiter.seq
    target_rows = np.flatnonzero(calls.rank == edge.target)
    in_group = target_rows[(calls.group[target_rows] == group) & (calls.seq[target_rows] < seq)]
    if not len(in_group):
        return False
    after = target_rows[calls.record[target_rows] > calls.record[in_group].max()]
    theirs = Counter((group_of[int(calls.group[r])], int(calls.op[r])) for r in after)
    beyond = {kind for kind, count in theirs.items() if count > reference.get(kind, 0)}
    if not beyond or not own_program:
        return bool(beyond)
    ordered = in_issue_order(calls, edge.target)
    kinds = [(group_of[int(g)], int(o)) for g, o in zip(calls.group[ordered].tolist(), calls.op[ordered].tolist())]
    marks = np.flatnonzero(calls.group[ordered] == group).tolist()
    own: Counter = Counter()
    for low, high in zip(marks[:-1], marks[1:]):
        own |= Counter(kind for kind in kinds[low + 1:high] if kind in beyond)
    return any(theirs[kind] > own.get(kind, 0) for kind in beyond)


def gone_past_first_call(edge: Edge, calls: Calls, group_of: dict[int, str], *, from_start: bool) -> bool:
    """Whether the absent target of ``edge``, waited for in a group's first call and having issued
    none of its calls, went past it: it issued calls of some kind more often than the waiter did
    before its own first call of the group. ``from_start``: both rings hold their first entries,
    so nothing before them is missing. (With gloo, which blocks in each call, a rank that issued
    the two calls the other way round leaves the same records: the skip is the reading taken.)"""
    group = edge.waiter.group
    if edge.waiter.seq != 1 or not from_start:
        return False
    target_rows = np.flatnonzero(calls.rank == edge.target)
    if not len(target_rows) or (calls.group[target_rows] == group).any():
        return False
    ordered = in_issue_order(calls, edge.waiter.rank)
    first = np.flatnonzero((calls.group[ordered] == group) & (calls.seq[ordered] == 1))
    if not len(first):
        return False
    before = Counter((group_of[int(g)], int(o)) for g, o in zip(calls.group[ordered[:first[0]]].tolist(),
                                                                 calls.op[ordered[:first[0]]].tolist()))
    theirs = Counter((group_of[int(g)], int(o)) for g, o in zip(calls.group[target_rows].tolist(),
                                                                calls.op[target_rows].tolist()))
    return any(count > before[kind] for kind, count in theirs.items())


def gone_past_transfer(entries: Entries, rank: int, *, peer: int, group: int, op: str) -> bool:
    """Whether ``rank``, waited for in a ``op`` (send or recv) with ``peer`` it never posted, went
    past it: after its last such transfer it issued collective calls of some group and op more
    often than between any two of its earlier ones, or it closed a period with fewer of these
    transfers than every earlier period (see the module docstring)."""
    if op not in entries.vocabulary.ops:
        return False
    code = entries.vocabulary.ops.index(op)
    rows = entries_in_order(entries, rank)
    mine = (entries.is_p2p[rows] & (entries.op[rows] == code) & (entries.peer[rows] == peer)
            & (entries.group[rows] == group))
    marks = np.flatnonzero(mine)
    if len(marks) < 2:
        return False  # no earlier stretch between two transfers to compare with
    collective = ~entries.is_p2p[rows]
    keys = [(int(g), int(o)) for g, o in zip(entries.group[rows].tolist(), entries.op[rows].tolist())]

    def between(lo: int, hi: int) -> Counter:
        return Counter(keys[i] for i in range(lo + 1, hi) if collective[i])

    reference: Counter = Counter()
    for lo, hi in zip(marks[:-1].tolist(), marks[1:].tolist()):
        reference |= between(lo, hi)
    since = between(int(marks[-1]), len(rows))
    if any(count > reference.get(key, 0) for key, count in since.items()):
        return True
    periods = _short_periods(keys, collective, mine, from_start=int(entries.record[rows].min()) == 0)
    if not periods:
        return False
    # a step that is short for both (fewer micro-batches, an eval step) is no skip: in that very
    # period (by the numbers of a collective both issue) the peer posted a usual period's worth
    peer_rows = entries_in_order(entries, peer)
    theirs = (entries.is_p2p[peer_rows] & (entries.op[peer_rows] != code) & (entries.peer[peer_rows] == rank)
              & (entries.group[peer_rows] == group))
    for (marker_group, marker_op), (low_index, high_index), usual in periods:
        low_seq, high_seq = int(entries.seq[rows[low_index]]), int(entries.seq[rows[high_index]])
        marker = np.flatnonzero(~entries.is_p2p[peer_rows] & (entries.group[peer_rows] == marker_group)
                                & (entries.op[peer_rows] == marker_op))
        low = marker[entries.seq[peer_rows[marker]] == low_seq]
        high = marker[entries.seq[peer_rows[marker]] == high_seq]
        end = int(high[0]) if len(high) else len(peer_rows)
        if len(low) and int(theirs[int(low[0]) + 1:end].sum()) >= usual:
            return True
    return False


def _short_periods(keys: list[tuple[int, int]], collective: np.ndarray, mine: np.ndarray, *,
                   from_start: bool) -> list[tuple[tuple[int, int], tuple[int, int], int]]:
    """The periods that hold fewer of the transfers ``mine`` marks than every earlier one: per
    collective kind (a step ends with the same call every time), the stretch between its last two
    calls, as (that kind, the two calls' indexes in the rank's rows, the fewest transfers of an
    earlier period). A step that posts several alike sends, one of which was skipped, looks normal
    to the stretches between transfers; its period does not. ``from_start``: the ring holds the
    rank's first entry, so its first period counts from there when it is the only earlier one."""
    positions: dict[tuple[int, int], list[int]] = {}
    for index in np.flatnonzero(collective).tolist():
        positions.setdefault(keys[index], []).append(index)
    before = np.concatenate([[0], np.cumsum(mine)])  # transfers before each position
    last_mark = int(np.flatnonzero(mine)[-1])
    found = []
    for kind, calls in positions.items():
        if calls[-1] < last_mark or len(calls) < 2:
            continue
        counts = [int(before[hi] - before[lo + 1]) for lo, hi in zip(calls[:-1], calls[1:])]
        if len(counts) == 1 and from_start:  # only when no whole period is there: it may start mid-period
            counts.insert(0, int(before[calls[0]]))
        if len(counts) > 1 and counts[-1] < min(counts[:-1]):
            found.append((kind, (calls[-2], calls[-1]), min(counts[:-1])))
    return found


def came_early(calls: Calls, rank: int, *, call: tuple[int, int], other: tuple[int, int], from_start: bool,
               peers: list[int]) -> bool:
    """Whether ``rank`` issued ``call`` (group, seq) sooner than its own program puts it: since its
    previous call of that group it issued fewer calls of kind ``other`` (group, op) than in every earlier
    stretch between two calls of that group (``from_start``: the rank's ring holds its first entry,
    so the stretch before its first call of the group counts when no earlier one is whole), while
    each of ``peers`` issued at least that many there (a step that is short for everyone is no
    sign). A rank that swapped two calls, or skipped one of several alike calls, shows it there;
    its peer, in order, does not."""
    group, seq = call
    usual = _fewest_before(calls, rank, group=group, seq=seq, other=other, from_start=from_start)
    if usual is None:
        return False
    for peer in peers:
        rows = in_issue_order(calls, peer)
        groups, seqs = calls.group[rows], calls.seq[rows]
        low = np.flatnonzero((groups == group) & (seqs == seq - 1))
        high = np.flatnonzero((groups == group) & (seqs == seq))
        if not len(low):
            return False
        start, end = int(low[0]) + 1, int(high[0]) if len(high) else len(rows)
        if int(((groups[start:end] == other[0]) & (calls.op[rows][start:end] == other[1])).sum()) < usual:
            return False
    return True


def _fewest_before(calls: Calls, rank: int, *, group: int, seq: int, other: tuple[int, int],
                   from_start: bool) -> int | None:
    """The fewest calls of kind ``other`` the rank issued between two calls of ``group`` before
    ``seq``, when it issued fewer than that between calls ``seq - 1`` and ``seq``; else None. The
    earlier stretches that end in the same call as ``seq`` are the ones compared when there are
    any: a group whose period holds other calls too (a barrier every few steps right after the
    step's all-reduce) has shorter stretches before those, which say nothing about this one."""
    rows = in_issue_order(calls, rank)
    marks: dict[int, int] = {}  # seq -> position of the rank's first call of that number in the group
    for index in np.flatnonzero(calls.group[rows] == group).tolist():
        marks.setdefault(int(calls.seq[rows[index]]), index)
    counted = (calls.group[rows] == other[0]) & (calls.op[rows] == other[1])
    before = np.concatenate([[0], np.cumsum(counted)])  # calls of ``other`` before each position
    stretches = {}
    for number, position in marks.items():
        previous = marks.get(number - 1)
        if previous is not None and previous < position:
            stretches[number] = int(before[position] - before[previous + 1])
    earlier = [count for number, count in stretches.items() if number < seq]
    if seq in marks:
        value = calls.value[rows]
        alike = [count for number, count in stretches.items()
                 if number < seq and value[marks[number]] == value[marks[seq]]]
        earlier = alike or earlier
    if not earlier and from_start and 1 in marks and seq > 1:
        earlier = [int(before[marks[1]])]  # only when no whole period is there: it may start mid-period
    if seq in stretches and earlier and stretches[seq] < min(earlier):
        return min(earlier)
    return None


def transfer_out_of_program(entries: Entries, rank: int, *, group: int, number: int) -> bool:
    """Whether the rank's send or receive ``number`` (its p2p number in ``group``) is not the one its
    program has at that place: every earlier period (between two calls of a recurring collective)
    posted the same transfers, and the one at this index of the period went the other way or to
    another peer (a receive posted where the rank always sends first). When no whole period is
    there, a ring that holds the rank's first entry lends the stretch before the first call."""
    rows = entries_in_order(entries, rank)
    transfer = (entries.is_p2p[rows] & (entries.group[rows] == group)).tolist()
    numbers = entries.p2p_seq[rows].tolist()
    here = next((i for i, (mine, n) in enumerate(zip(transfer, numbers)) if mine and n == number), None)
    if here is None:
        return False
    kinds = list(zip(entries.op[rows].tolist(), entries.peer[rows].tolist()))
    markers: dict[tuple[int, int], list[int]] = {}  # recurring collective -> its positions before ``here``
    for index in np.flatnonzero(~entries.is_p2p[rows][:here]).tolist():
        markers.setdefault((int(entries.group[rows[index]]), int(entries.op[rows[index]])), []).append(index)
    from_start = int(entries.record[rows].min()) == 0
    for positions in markers.values():
        periods = list(zip(positions[:-1], positions[1:])) or ([(-1, positions[0])] if from_start else [])
        patterns = {tuple(kinds[i] for i in range(low + 1, high) if transfer[i]) for low, high in periods}
        if len(patterns) != 1:
            continue
        pattern = patterns.pop()
        index = sum(transfer[positions[-1] + 1:here])
        if index < len(pattern) and pattern[index] != kinds[here]:
            return True
    return False


def late_for(edge: Edge, calls: Calls, group_of: dict[int, str], *, reference: Counter, played: set[str],
             own_program: bool = False, from_start: bool = False) -> bool:
    """Whether the behind target of ``edge`` issued its own call of the waited number only after
    more calls of some kind than the job issues between the group's previous call and that one
    (``reference``, from ``program_between``): its call of that number is a later call, and the
    one its peers wait in is one it skipped. Only the calls of ``played`` (the kinds of group its
    peers are members of) are counted: the others say nothing of the program its peers run.
    ``own_program`` also asks for more than the rank issued itself between any two earlier calls
    of the group: when the only peers playing a role are late themselves (two ranks that swapped
    two calls look late to each other), the reference is short, and the rank's own program tells
    which of them changed it (``from_start``: the rank's ring holds its first entry, so what it
    issued before its first call of the group counts too)."""
    group, seq = edge.waiter.group, edge.waiter.seq
    rows = np.flatnonzero(calls.rank == edge.target)
    in_group = rows[calls.group[rows] == group]
    if not (calls.seq[in_group] == seq).any() or not (calls.seq[in_group] == seq - 1).any():
        return False
    ordered = in_issue_order(calls, edge.target)
    kinds = [(group_of[int(g)], int(o)) for g, o in zip(calls.group[ordered].tolist(), calls.op[ordered].tolist())]
    mine = (calls.group[ordered] == group).tolist()
    seqs = calls.seq[ordered].tolist()
    place, last = {}, {}  # seq -> index in ``ordered`` of the rank's first (last) call of that number
    for index in np.flatnonzero(mine).tolist():
        place.setdefault(seqs[index], index)
        last[seqs[index]] = index
    theirs = Counter(kinds[last[seq - 1] + 1:place[seq]]) if last[seq - 1] < place[seq] else Counter()
    excess = {kind for kind, count in theirs.items() if kind[0] in played and count > reference.get(kind, 0)}
    if not excess or not own_program:
        return bool(excess)
    # its own earlier periods: a rank whose program puts these calls there every time did not skip
    own: Counter = Counter(kind for kind in kinds[:place[1]] if kind in excess) if from_start and 1 in place else Counter()
    for earlier, index in last.items():
        after = place.get(earlier + 1)
        if earlier + 1 < seq and after is not None and index < after:
            own |= Counter(kind for kind in kinds[index + 1:after] if kind in excess)
    return any(theirs[kind] > own.get(kind, 0) for kind in excess)
