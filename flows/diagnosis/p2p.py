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
from dataclasses import dataclass, field
from itertools import takewhile
from typing import Iterator

import numpy as np

from rankstream.flows.diagnosis.entries import Entries

__all__ = ["Transfer", "Mismatch", "Pairing", "pair_p2p", "unmatched_p2p", "mark_batch_closes"]

COMPLETED = 2


@dataclass(frozen=True)
class Transfer:
    """One unfinished send or receive of rank ``waiter`` with ``peer`` (global ranks)."""

    waiter: int
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
    #: Its kernel started (NCCL): it is on the device, waiting for its counterpart.
    started: bool = False


@dataclass(frozen=True)
class Mismatch:
    """A send and the receive that pairs with it, both unfinished, of other sizes or dtypes: the
    transfer never completes. ``culprit`` is the side that differs from the pair's last completed
    transfer (None when the history cannot tell)."""

    send: Transfer
    recv: Transfer
    culprit: int | None
    what: str  # "size" or "dtype"


@dataclass(frozen=True)
class Pairing:
    """What the diagnosis reads from a run's sends and receives, worked out once (``pair_p2p``)."""

    #: Transfers that cannot complete: no counterpart posted, or crossed with it (``_crossed``).
    unmatched: list[Transfer]
    mismatched: list[Mismatch]
    #: (waiting, behind): a started transfer and its counterpart, posted but not started (the
    #: peer's device is still in something earlier).
    behind: list[tuple[Transfer, Transfer]] = field(default_factory=list)


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


def pair_p2p(entries: Entries) -> Pairing:
    streams = _unfinished_by_stream(entries)
    left = _left_over(streams)
    ordered = list(_in_stream_order(streams, _pairs_of(left)))
    unseen = _beyond_the_peers_ring(entries, left, streams)
    unmatched = sorted([t for t in left if t not in unseen] + _crossed(ordered),
                       key=lambda t: (t.group, t.p2p_seq, t.waiter))
    return Pairing(unmatched, _mismatched(entries, ordered), _behind(streams, _pairs_of(left)))


def unmatched_p2p(entries: Entries) -> list[Transfer]:
    return pair_p2p(entries).unmatched


def _left_over(streams: dict[tuple[int, int, int], list[Transfer]]) -> list[Transfer]:
    """The unfinished transfers that outnumber their counterparts, per direction between two ranks."""
    pending: dict[tuple, list[Transfer]] = {}
    for (group, rank, peer), transfers in streams.items():
        for transfer in transfers:
            src, dst = (rank, peer) if transfer.op == "send" else (peer, rank)
            pending.setdefault((group, src, dst, transfer.op), []).append(transfer)
    left = []
    for (group, src, dst, kind), mine in pending.items():
        left += mine[len(pending.get((group, src, dst, "recv" if kind == "send" else "send"), [])):]
    return left


def _beyond_the_peers_ring(entries: Entries, left: list[Transfer],
                           streams: dict[tuple[int, int, int], list[Transfer]]) -> set[Transfer]:
    """The left-over transfers whose counterpart may have fallen out of the peer's ring, so that
    nothing proves the peer never posted it: the peer's ring wrapped and keeps no transfer with
    the waiter that started or completed (one would prove every earlier transfer between the two
    finished: one stream, run in order), and none of the waiter's transfers with the peer is on
    its device yet (queued behind other work, it waits for nobody). That is a host that ran more
    than a ring's worth ahead of its device, not a hang."""
    if not left:
        return set()
    peers = np.unique([t.peer for t in left])
    held = np.isin(entries.rank, peers)  # a ring that still holds record 0 never wrapped
    wrapped = set(entries.rank[held].tolist()) - set(entries.rank[held & (entries.record == 0)].tolist())
    ran = np.flatnonzero(held & entries.is_p2p & (entries.state >= 1))
    anchored = set(zip(entries.group[ran].tolist(), entries.rank[ran].tolist(), entries.peer[ran].tolist()))
    closes = np.flatnonzero(entries.is_p2p & (entries.state >= 1) & (entries.peer < 0))
    started_batches = set(zip(entries.rank[closes].tolist(), entries.group[closes].tolist(),
                              entries.p2p_seq[closes].tolist()))
    on_device = {key for key, transfers in streams.items()
                 if any(t.started or (t.batched and (t.waiter, t.group, t.p2p_seq) in started_batches)
                        for t in transfers)}
    return {t for t in left if t.peer in wrapped and (t.group, t.peer, t.waiter) not in anchored
            and (t.group, t.waiter, t.peer) not in on_device}


def _pairs_of(transfers: list[Transfer]) -> set[tuple[int, int, int]]:
    """(group, low rank, high rank) of each transfer's two ranks."""
    return {(t.group, min(t.waiter, t.peer), max(t.waiter, t.peer)) for t in transfers}


def _in_stream_order(streams: dict[tuple[int, int, int], list[Transfer]],
                     unpaired: set[tuple[int, int, int]]) -> Iterator[list[tuple[Transfer, Transfer]]]:
    """For two ranks whose transfers all have counterparts (``unpaired`` lists the others: a rank
    that skipped one is a different fault), their unfinished transfers with each other paired in
    the order each posted them, up to the first batch (which starts as a whole: no order there)."""
    for (group, rank, peer), mine in streams.items():
        if rank < peer and (group, rank, peer) not in unpaired:
            yield list(takewhile(lambda pair: not (pair[0].batched or pair[1].batched),
                                 zip(mine, streams.get((group, peer, rank), []))))


def _crossed(ordered: list[list[tuple[Transfer, Transfer]]]) -> list[Transfer]:
    """The first transfers of two ranks with each other that are the same kind (both receive, or
    both send, first): each waits on its stream for a counterpart queued behind the other's."""
    blocked = []
    for pairs in ordered:
        at = _first_crossing(pairs)
        if at < len(pairs):
            blocked += pairs[at]
    return blocked


def _first_crossing(pairs: list[tuple[Transfer, Transfer]]) -> int:
    """Index of the first pair of the same kind, or len(pairs)."""
    return next((i for i, (mine, theirs) in enumerate(pairs) if mine.op == theirs.op), len(pairs))


def _mismatched(entries: Entries, ordered: list[list[tuple[Transfer, Transfer]]]) -> list[Mismatch]:
    """Pairs before any crossing whose send and receive disagree on sizes or dtypes."""
    found = []
    for pairs in ordered:
        for mine, theirs in pairs[:_first_crossing(pairs)]:
            send, recv = (mine, theirs) if mine.op == "send" else (theirs, mine)
            what = "size" if send.shape != recv.shape else "dtype" if send.dtype != recv.dtype else None
            if what:
                found.append(Mismatch(send, recv, _differs_from_history(entries, send, recv, what), what))
    return found


def _behind(streams: dict[tuple[int, int, int], list[Transfer]],
            unpaired: set[tuple[int, int, int]]) -> list[tuple[Transfer, Transfer]]:
    """Transfers that started while their counterpart did not: (started, behind). Paired in the
    order each side posted them, batches included (a batch starts as a whole, so its members'
    order does not change which side started), up to the first crossing outside a batch."""
    found = []
    for (group, rank, peer), mine in streams.items():
        if rank > peer or (group, rank, peer) in unpaired:
            continue
        for first, second in zip(mine, streams.get((group, peer, rank), [])):
            if first.op == second.op and not (first.batched or second.batched):
                break
            if first.started != second.started:
                found.append((first, second) if first.started else (second, first))
    return found


def _unfinished_by_stream(entries: Entries) -> dict[tuple[int, int, int], list[Transfer]]:
    """(group, rank, peer) -> the rank's unfinished sends to and receives from the peer, in the
    order it posted them: NCCL runs a rank's transfers with one peer on one stream, in that order."""
    ops = entries.vocabulary.ops
    paired = np.isin(entries.op, [code for code, op in enumerate(ops) if op in ("send", "recv")])
    rows = np.flatnonzero(entries.is_p2p & paired & (entries.state < COMPLETED))
    if not len(rows):
        return {}
    rows = rows[np.argsort(entries.record[rows], kind="stable")]
    batched = _shares_its_p2p_number(entries, rows)
    streams: dict[tuple[int, int, int], list[Transfer]] = {}
    for row, in_batch in zip(rows.tolist(), batched.tolist()):
        transfer = Transfer(int(entries.rank[row]), int(entries.peer[row]), int(entries.group[row]),
                            int(entries.p2p_seq[row]), ops[entries.op[row]], int(entries.record[row]),
                            int(entries.created[row]), int(entries.shape[row]), int(entries.dtype[row]), in_batch,
                            bool(entries.state[row] == 1))
        streams.setdefault((transfer.group, transfer.waiter, transfer.peer), []).append(transfer)
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


def _differs_from_history(entries: Entries, send: Transfer, recv: Transfer, what: str) -> int | None:
    """The rank whose side differs from the last completed transfer from sender to receiver."""
    column = entries.shape if what == "size" else entries.dtype
    done = np.flatnonzero(entries.is_p2p & (entries.state >= COMPLETED) & (entries.group == send.group)
                          & (entries.rank == send.waiter) & (entries.peer == recv.waiter)
                          & (entries.op == entries.vocabulary.ops.index("send")))
    if not len(done):
        return None
    before = int(column[done[np.argmax(entries.record[done])]])
    mine, theirs = (send.shape, recv.shape) if what == "size" else (send.dtype, recv.dtype)
    return recv.waiter if mine == before != theirs else send.waiter if theirs == before != mine else None
