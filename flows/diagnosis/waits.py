"""The wait-for graph: who is blocked, on whom, and where the waiting ends.

A rank waits where it has a collective that has not completed: with NCCL, its oldest entry per
group whose state is not ``completed``; with gloo, whose entries all stay ``scheduled``, its newest
entry (a gloo collective blocks the calling thread), when some member could not have joined it.
It waits *for* the members of that group that never issued that sequence number (or left no
dump). Following those edges from every waiting rank ends at a rank that waits for nobody (a sink:
the root of a hang, with everyone upstream its consequence) or goes round a cycle (a deadlock).
A waiting position that every member reached ends the chain in another way: the members disagree
about it (a mismatch, judged by ``matching``), or every peer completed it and this rank did not
(it is stuck in it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rankstream.flows.diagnosis.calls import Calls
from rankstream.flows.diagnosis.sequences import GroupSequences

__all__ = ["Position", "WaitGraph", "waiting_positions", "build_wait_graph"]

COMPLETED = 2


@dataclass(frozen=True)
class Position:
    """Rank ``rank`` is inside collective ``seq`` of group ``group`` (a group code)."""

    rank: int
    group: int
    seq: int


@dataclass
class WaitGraph:
    #: rank -> ranks it waits for, with where: (waiter position, absent rank).
    edges: dict[int, dict[int, Position]] = field(default_factory=dict)
    #: Positions every member reached, each member issued the same call, every peer completed it,
    #: and this rank did not.
    stuck: list[Position] = field(default_factory=list)
    #: Positions whose members all arrived but disagree (the matching names the culprit).
    disputed: list[Position] = field(default_factory=list)
    #: Every rank that waits somewhere, by position.
    waiting: list[Position] = field(default_factory=list)

    def waits_for(self, rank: int) -> dict[int, Position]:
        return self.edges.get(rank, {})

    def upstream(self, ranks: set[int]) -> set[int]:
        """Every rank whose waiting leads to one of ``ranks`` (not counting them)."""
        reverse: dict[int, set[int]] = {}
        for waiter, targets in self.edges.items():
            for target in targets:
                reverse.setdefault(target, set()).add(waiter)
        seen, frontier = set(), list(ranks)
        while frontier:
            for waiter in reverse.get(frontier.pop(), ()):
                if waiter not in seen and waiter not in ranks:
                    seen.add(waiter)
                    frontier.append(waiter)
        return seen

    def sinks(self) -> list[int]:
        """Ranks waited for that wait for nobody."""
        targets = {t for targets in self.edges.values() for t in targets}
        return sorted(t for t in targets if not self.edges.get(t))

    def cycles(self) -> list[list[int]]:
        """Groups of ranks that wait for each other (strongly connected, more than one rank)."""
        index, low, stack, on_stack, found = {}, {}, [], set(), []
        counter = [0]

        def visit(node: int) -> None:  # Tarjan, iterative enough for the depths seen here
            index[node] = low[node] = counter[0]
            counter[0] += 1
            stack.append(node)
            on_stack.add(node)
            for target in self.edges.get(node, {}):
                if target not in index:
                    visit(target)
                    low[node] = min(low[node], low[target])
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

        for node in sorted(self.edges):
            if node not in index:
                visit(node)
        return found


def waiting_positions(calls: Calls, stateless: set[int]) -> list[Position]:
    """Where each rank may be blocked: its oldest unfinished call per group (NCCL), or its newest
    call (ranks in ``stateless``, whose entries never say whether they finished: gloo)."""
    positions = []
    unfinished = np.flatnonzero(calls.state < COMPLETED)
    order = unfinished[np.lexsort((calls.seq[unfinished], calls.group[unfinished], calls.rank[unfinished]))]
    previous = None
    for row in order.tolist():
        rank, group = int(calls.rank[row]), int(calls.group[row])
        if rank in stateless or (rank, group) == previous:
            continue
        previous = (rank, group)
        positions.append(Position(rank, group, int(calls.seq[row])))
    if stateless:
        ranks = calls.rank
        for rank in sorted(stateless):
            rows = np.flatnonzero(ranks == rank)
            if len(rows):
                newest = rows[np.argmax(calls.record[rows])]
                positions.append(Position(rank, int(calls.group[newest]), int(calls.seq[newest])))
    return positions


def build_wait_graph(positions: list[Position], sequences: dict[int, GroupSequences], dumped: set[int],
                     stateless: set[int]) -> WaitGraph:
    graph = WaitGraph()
    last = {code: seqs.last_seq() for code, seqs in sequences.items()}
    for position in positions:
        seqs = sequences.get(position.group)
        if seqs is None:
            continue
        reached = last[position.group]
        absent = [m for m in seqs.group.members if m != position.rank
                  and (m not in dumped or reached.get(m, -1) < position.seq)]
        if absent:
            graph.waiting.append(position)
            for member in absent:
                graph.edges.setdefault(position.rank, {})[member] = position
            continue
        values = seqs.values_at(position.seq)
        if len(set(values.values())) > 1:
            graph.waiting.append(position)
            graph.disputed.append(position)
            continue
        if position.rank in stateless:
            continue  # everyone joined it: a gloo collective that completed
        states = seqs.states_at(position.seq)
        peers = [state for rank, state in states.items() if rank != position.rank]
        if peers and all(state >= COMPLETED for state in peers):
            graph.stuck.append(position)
    return graph
