"""Program order: which of two calls a rank reaches first, learned from the ranks that run the same
program (the members of its groups), and whether a rank that left no dump was seen past a call."""

from __future__ import annotations

import functools

import numpy as np

from rankstream.flows.diagnosis.run import Run
from rankstream.flows.diagnosis.waits import Edge, Position

__all__ = ["first_in_program", "completed_later"]


def first_in_program(run: Run, edges: list[Edge]) -> Edge:
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


def _records_by_kind(run: Run, wanted: set[tuple]) -> dict[int, dict[tuple, int]]:
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


def completed_later(run: Run, rank: int, where: Position) -> str | None:
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


def _created(run: Run, edge: Edge) -> list[int]:
    if edge.waiter.seq < 0:
        return [g.created for g in run.p2p.unmatched
                if (g.waiter, g.group, -g.p2p_seq) == (edge.waiter.rank, edge.waiter.group, edge.waiter.seq)]
    rows = run.sequences[edge.waiter.group].rows_at(edge.waiter.seq)
    return [int(run.calls.created[r]) for r in rows.values()]


