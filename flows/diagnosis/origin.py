"""Where a shift began: the stretch of calls in which a rank skipped or added one.

A rank that skipped a call (or issued an extra one) long before the hang, in a group whose calls
are all alike (equal gradient buckets), still completes its later calls: each meets a peer's call
of the same size, one off. Its calls are then shifted against the program, which shows in what it
does *between* them: before its call ``#k`` it made a different number of calls in other groups
than its peers made before theirs. The first call where that differs ends the shifted stretch;
the stretch (the run of calls with nothing in between) where the rank's count went wrong is where
the skip or the extra call is.
"""

from __future__ import annotations

import numpy as np

from rankstream.flows.diagnosis.calls import Calls

__all__ = ["shift_origin"]

_PEERS = 16


def _gaps(calls: Calls, rank: int, group: int, counted: np.ndarray) -> dict[int, int]:
    """seq -> how many calls of the ``counted`` groups the rank made between its previous call of
    ``group`` and this one (only where the record holds that previous call)."""
    rows = np.flatnonzero(calls.rank == rank)
    rows = rows[np.argsort(calls.record[rows])]
    groups = calls.group[rows]
    kept = (groups == group) | np.isin(groups, counted)
    rows, groups = rows[kept], groups[kept]
    positions = np.flatnonzero(groups == group)
    seqs = calls.seq[rows][positions]
    # a rank numbers every call it issues: a number missing from its record is entries its ring
    # overwrote before they were read, and what it did there is unknown, not a gap of zero calls
    return {int(seq): int(position - previous - 1)
            for seq, last, position, previous in zip(seqs[1:], seqs[:-1], positions[1:], positions[:-1])
            if seq == last + 1}


def _roles_of(calls: Calls, rank: int, roles: dict[int, str]) -> dict[int, str]:
    """The groups the rank issued calls in: code -> role."""
    return {code: roles[code] for code in np.unique(calls.group[calls.rank == rank]).tolist()}


def shift_origin(calls: Calls, rank: int, group: int, *, peers: list[int], before: int,
                 roles: dict[int, str]) -> tuple[int, int] | None:
    """The stretch ``(first, last)`` of ``rank``'s calls of ``group`` in which they stopped lining up
    with its peers' program, if that is before ``before``; None when they line up throughout.
    ``roles``: group code -> role. Only the calls of roles both sides play are counted: a peer's
    calls in a group the rank has no part in say nothing of the rank's program. At most
    ``_PEERS`` peers are read: they run one program, and reading each costs a pass over every call."""
    peers = peers[:_PEERS]
    mine_by_group = _roles_of(calls, rank, roles)
    mine: dict[int, int] = {}
    reference: dict[int, int] = {}
    for peer in peers:
        theirs_by_group = _roles_of(calls, peer, roles)
        shared = set(mine_by_group.values()) & set(theirs_by_group.values())
        for side, by_group, gaps in ((rank, mine_by_group, mine), (peer, theirs_by_group, reference)):
            counted = np.array([code for code, role in by_group.items() if role in shared and code != group])
            for seq, gap in _gaps(calls, side, group, counted).items():
                gaps[seq] = max(gaps.get(seq, 0), gap)
    for seq in sorted(set(mine) & set(reference)):
        if seq >= before:
            return None
        if mine[seq] == reference[seq]:
            continue
        # later than the program (it skipped a call before): the stretch ends at the previous call;
        # earlier than the program (an extra call): the stretch holds this one
        end = seq - 1 if mine[seq] > reference[seq] else seq
        start = end
        while mine.get(start, 1) == 0:
            start -= 1
        return start, end
    return None
