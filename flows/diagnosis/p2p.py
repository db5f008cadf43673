"""Point-to-point pairing: every send needs its receive, and a group used only for send/recv has
no collectives that every member must reach.

A send from A to B and the receive on B from A complete together, so only operations that have
not completed can be unmatched. Per (group, src, dst), A's unfinished sends to B pair with B's
unfinished receives from A in order (and the reverse for receives); one left over waits for a
peer that never posted its side. This holds however the ring buffers wrapped, since it looks only
at what is still running. gloo records no send/recv, so there is nothing to pair there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankstream.flows.diagnosis.entries import Entries

__all__ = ["Unmatched", "unmatched_p2p"]

COMPLETED = 2


@dataclass(frozen=True)
class Unmatched:
    """Rank ``waiter``'s unfinished ``op`` (send or recv) with ``peer``, which posted no counterpart."""

    waiter: int
    peer: int
    group: int
    p2p_seq: int
    op: str
    record: int
    created: int


def unmatched_p2p(entries: Entries) -> list[Unmatched]:
    rows = np.flatnonzero(entries.is_p2p & (entries.state < COMPLETED))
    if not len(rows):
        return []
    ops = entries.vocabulary.ops
    pending: dict[tuple, list[tuple[int, int, int]]] = {}
    for row in rows[np.argsort(entries.record[rows], kind="stable")].tolist():
        rank, peer, op = int(entries.rank[row]), int(entries.peer[row]), ops[entries.op[row]]
        src, dst = (rank, peer) if op == "send" else (peer, rank)
        pending.setdefault((int(entries.group[row]), src, dst, op), []).append(
            (rank, int(entries.p2p_seq[row]), int(entries.record[row]), int(entries.created[row])))
    found = []
    for (group, src, dst, op), mine in pending.items():
        other = pending.get((group, src, dst, "recv" if op == "send" else "send"), [])
        for rank, p2p_seq, record, created in mine[len(other):]:
            found.append(Unmatched(rank, dst if op == "send" else src, group, p2p_seq, op, record, created))
    return sorted(found, key=lambda u: (u.group, u.p2p_seq, u.waiter))
