"""Point-to-point pairing: every send needs its receive, and a group used only for send/recv has
no collectives that every member must reach.

A send from A to B and the receive on B from A complete together, so only operations that have
not completed can be unmatched. Per (group, src, dst), A's unfinished sends to B pair with B's
unfinished receives from A in order (and the reverse for receives); one left over waits for a
peer that never posted its side. This holds however the ring buffers wrapped, since it looks only
at what is still running. gloo records no send/recv, so there is nothing to pair there.

NCCL runs a rank's transfers with one peer on one stream, in the order posted. So two ranks
whose first unfinished transfers with each other are both receives (or both sends) wait for each
other for good, and a send and the receive it pairs with in that order never complete when their
sizes or dtypes differ.

A batch of sends and receives (``batch_isend_irecv``) ends with a ``coalesced`` entry that carries
the batch's p2p number and the group's current collective number. It belongs to the batch, not to
the collective of that number (torch's ``fr_trace`` pairs it the same way, by p2p number).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from rankstream.flows.diagnosis.entries import Entries

__all__ = ["Unmatched", "Mismatch", "unmatched_p2p", "mismatched_p2p", "mark_batch_closes"]

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


def mark_batch_closes(entries: Entries) -> None:
    """Mark as p2p (``is_p2p``, no peer) each ``coalesced`` entry that closes a batch of sends and
    receives: the entry recorded just before it on its rank is a send or receive of the same group
    with the same p2p number. Left unmarked, it joins the collective of its number as a member."""
    ops = entries.vocabulary.ops
    if "coalesced" not in ops or not entries.is_p2p.any():
        return
    closes = np.flatnonzero((entries.op == ops.index("coalesced")) & ~entries.is_p2p)
    members = np.flatnonzero(entries.is_p2p)
    member_at = {(rank, record): (group, p2p_seq) for rank, record, group, p2p_seq in zip(
        entries.rank[members].tolist(), entries.record[members].tolist(), entries.group[members].tolist(),
        entries.p2p_seq[members].tolist())}
    for row, rank, record, group, p2p_seq in zip(closes.tolist(), entries.rank[closes].tolist(),
                                                 entries.record[closes].tolist(), entries.group[closes].tolist(),
                                                 entries.p2p_seq[closes].tolist()):
        if member_at.get((rank, record - 1)) == (group, p2p_seq):
            entries.is_p2p[row] = True


def unmatched_p2p(entries: Entries) -> list[Unmatched]:
    """Unfinished sends and receives that cannot complete: with no counterpart posted, or (see
    ``_crossed``) ordered on both ranks so that neither counterpart can start."""
    streams = _unfinished_by_stream(entries)
    left = _left_over(streams)
    return sorted(map(_waiting, left + _crossed(streams, _pairs_of(left))), key=lambda u: (u.group, u.p2p_seq, u.waiter))


def _left_over(streams: dict[tuple[int, int, int], list["_Op"]]) -> list["_Op"]:
    """The unfinished transfers that outnumber their counterparts, per direction between two ranks."""
    pending: dict[tuple, list[_Op]] = {}
    for (group, rank, peer), ops in streams.items():
        for op in ops:
            src, dst = (rank, peer) if op.op == "send" else (peer, rank)
            pending.setdefault((group, src, dst, op.op), []).append(op)
    left = []
    for (group, src, dst, kind), mine in pending.items():
        left += mine[len(pending.get((group, src, dst, "recv" if kind == "send" else "send"), [])):]
    return left


def _pairs_of(ops: list["_Op"]) -> set[tuple[int, int, int]]:
    """(group, low rank, high rank) of each transfer's two ranks."""
    return {(op.group, min(op.rank, op.peer), max(op.rank, op.peer)) for op in ops}


@dataclass(frozen=True)
class Mismatch:
    """A send and the receive that pairs with it, both unfinished, of other sizes or dtypes: the
    transfer never completes. ``culprit`` is the side that differs from the pair's last completed
    transfer (None when the history cannot tell)."""

    send: "_Op"
    recv: "_Op"
    culprit: int | None
    what: str  # "size" or "dtype"


def mismatched_p2p(entries: Entries) -> list[Mismatch]:
    """Pairs of unfinished sends and receives, matched in stream order, that disagree."""
    streams = _unfinished_by_stream(entries)
    unpaired = _pairs_of(_left_over(streams))
    found = []
    for (group, rank, peer), mine in streams.items():
        if rank > peer or (group, rank, peer) in unpaired:
            continue
        for op, other in zip(mine, streams.get((group, peer, rank), [])):
            if op.op == other.op or op.batched or other.batched:
                break  # crossed (``_crossed``), or a batch: no pairing by order from here
            send, recv = (op, other) if op.op == "send" else (other, op)
            what = "size" if send.shape != recv.shape else "dtype" if send.dtype != recv.dtype else None
            if what:
                found.append(Mismatch(send, recv, _differs_from_history(entries, send, recv, what), what))
    return found


@dataclass(frozen=True)
class _Op:
    rank: int
    peer: int
    group: int
    p2p_seq: int
    op: str
    record: int
    created: int
    shape: int
    dtype: int
    #: Posted with others in one ``batch_isend_irecv``: the batch starts as a whole.
    batched: bool


def _waiting(op: _Op) -> Unmatched:
    return Unmatched(op.rank, op.peer, op.group, op.p2p_seq, op.op, op.record, op.created)


def _unfinished_by_stream(entries: Entries) -> dict[tuple[int, int, int], list[_Op]]:
    """(group, rank, peer) -> the rank's unfinished sends to and receives from the peer, in the
    order it posted them: NCCL runs a rank's transfers with one peer on one stream, in that order."""
    ops = entries.vocabulary.ops
    paired = np.isin(entries.op, [code for code, op in enumerate(ops) if op in ("send", "recv")])
    rows = np.flatnonzero(entries.is_p2p & paired & (entries.state < COMPLETED))
    if not len(rows):
        return {}
    rows = rows[np.argsort(entries.record[rows], kind="stable")]
    batched = _shares_its_p2p_number(entries, rows)
    streams: dict[tuple[int, int, int], list[_Op]] = {}
    for row, in_batch in zip(rows.tolist(), batched.tolist()):
        rank, group, p2p_seq = int(entries.rank[row]), int(entries.group[row]), int(entries.p2p_seq[row])
        op = _Op(rank, int(entries.peer[row]), group, p2p_seq, ops[entries.op[row]], int(entries.record[row]),
                 int(entries.created[row]), int(entries.shape[row]), int(entries.dtype[row]), in_batch)
        streams.setdefault((group, rank, op.peer), []).append(op)
    return streams


def _shares_its_p2p_number(entries: Entries, rows: np.ndarray) -> np.ndarray:
    """Per row of ``rows``: whether another p2p entry of its rank and group has its p2p number (a
    batch's members and its close share one). A pipeline's dumps hold millions of p2p entries:
    only those with one of the wanted numbers are counted in Python."""
    p2p = np.flatnonzero(entries.is_p2p)
    near = p2p[np.isin(entries.p2p_seq[p2p], entries.p2p_seq[rows])]
    counts = Counter(zip(entries.rank[near].tolist(), entries.group[near].tolist(), entries.p2p_seq[near].tolist()))
    wanted = zip(entries.rank[rows].tolist(), entries.group[rows].tolist(), entries.p2p_seq[rows].tolist())
    return np.array([counts[key] > 1 for key in wanted], dtype=bool)


def _crossed(streams: dict[tuple[int, int, int], list[_Op]], unpaired: set[tuple[int, int, int]]) -> list[_Op]:
    """The first transfers of two ranks with each other that are the same kind (both receive, or
    both send, first): each waits on its stream for a counterpart queued behind the other's. Only
    between ranks whose transfers all have counterparts (``unpaired`` lists the others: a rank
    that skipped one is a different fault), and never inside a batch, which starts as a whole."""
    blocked = []
    for (group, rank, peer), mine in streams.items():
        theirs = streams.get((group, peer, rank), [])
        if rank > peer or not theirs or (group, rank, peer) in unpaired:
            continue
        for op, other in zip(mine, theirs):
            if op.batched or other.batched:
                break
            if op.op == other.op:
                blocked += [op, other]
                break
    return blocked


def _differs_from_history(entries: Entries, send: _Op, recv: _Op, what: str) -> int | None:
    """The rank whose side differs from the last completed transfer from sender to receiver."""
    column = entries.shape if what == "size" else entries.dtype
    done = np.flatnonzero(entries.is_p2p & (entries.state >= COMPLETED) & (entries.group == send.group)
                          & (entries.rank == send.rank) & (entries.peer == recv.rank)
                          & (entries.op == entries.vocabulary.ops.index("send")))
    if not len(done):
        return None
    before = int(column[done[np.argmax(entries.record[done])]])
    mine, theirs = (send.shape, recv.shape) if what == "size" else (send.dtype, recv.dtype)
    return recv.rank if mine == before != theirs else send.rank if theirs == before != mine else None
