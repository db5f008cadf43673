"""Collective calls: one row per (rank, group, sequence number), the unit the ranks must agree on.

Most entries are one call each. A coalesced group (several entries sharing one sequence number,
closed by a ``coalesced`` entry) is one call whose op, shapes and dtypes are its members' in order,
so a rank that coalesced other ops disagrees with its peers like any other call. Point-to-point
entries are not calls (``p2p`` pairs them instead).

A rank's ring buffer keeps its newest entries: once it has wrapped (its oldest record is not 0),
the coalesced call holding its oldest entry may have lost its first members, or all of them (a
lone close). Such a call is taken to be what its peers issued there; judged as it stands, a
healthy rank would look desynced.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankstream.flows.diagnosis.entries import Entries

__all__ = ["Calls", "collective_calls"]


@dataclass
class Calls:
    """Sorted by (group, seq, rank). ``value`` numbers each distinct (op, shape, dtype) so that
    "the ranks agree" is one comparison; ``op``/``shape``/``dtype`` say what differs."""

    group: np.ndarray
    seq: np.ndarray
    rank: np.ndarray
    op: np.ndarray
    shape: np.ndarray
    dtype: np.ndarray
    value: np.ndarray
    state: np.ndarray
    created: np.ndarray
    #: Creation to completion on the rank's own clock, in microseconds (-1: unknown).
    waited: np.ndarray
    record: np.ndarray
    #: ``parts[value]`` is the (op, shape, dtype) codes of a value.
    parts: np.ndarray

    def __len__(self) -> int:
        return len(self.rank)

    def unpack(self, value: int) -> tuple[int, int, int]:
        """``value`` as (op, shape, dtype) codes."""
        op, shape, dtype = self.parts[int(value)]
        return int(op), int(shape), int(dtype)


def collective_calls(entries: Entries) -> Calls:
    """The calls of ``entries``. Sorts ``entries`` in place, the collective entries first by (group,
    seq, rank, record): the calls are then views of their first rows, not a copy of every column
    (at 8192 ranks x 2000 entries a copy is a gigabyte). No step of the diagnosis depends on the
    order of the entries."""
    oldest = _oldest_records(entries)
    not_call = entries.is_p2p | (entries.seq <= 0)
    entries.reorder(np.lexsort((entries.record, entries.rank, entries.seq, entries.group, not_call)))
    part = entries.head(len(not_call) - int(np.count_nonzero(not_call)))
    del not_call
    group, seq, rank = part.group, part.seq, part.rank
    first = np.ones(len(part), dtype=bool)
    first[1:] = (group[1:] != group[:-1]) | (seq[1:] != seq[:-1]) | (rank[1:] != rank[:-1])
    starts = np.flatnonzero(first)
    if len(starts) < len(part):  # coalesced: several entries per call
        op, shape, dtype = _coalesce(part, starts)
    else:
        op, shape, dtype = part.op, part.shape, part.dtype
    shapes, dtypes = int(shape.max(initial=0)) + 1, int(dtype.max(initial=0)) + 1
    packed = (op.astype(np.int64) * shapes + shape) * dtypes + dtype
    keys, value = np.unique(packed, return_inverse=True)
    value = value.reshape(-1)
    rest, dtype_of = np.divmod(keys, dtypes)
    op_of, shape_of = np.divmod(rest, shapes)
    parts = np.stack([op_of, shape_of, dtype_of], axis=1)
    if len(starts) == len(part):  # one entry per call (nothing coalesced): the gathered columns as they are
        calls = Calls(group=group, seq=seq, rank=rank, op=op, shape=shape, dtype=dtype, value=value,
                      state=part.state, created=part.created, waited=part.waited, record=part.record, parts=parts)
    else:
        calls = Calls(group=group[starts], seq=seq[starts], rank=rank[starts], op=op, shape=shape, dtype=dtype,
                      value=value, state=np.minimum.reduceat(part.state, starts) if len(part) else part.state,
                      created=part.created[starts], waited=np.maximum.reduceat(part.waited, starts) if len(part)
                      else part.waited, record=part.record[starts], parts=parts)
    coalesced = [code for code, name in enumerate(part.vocabulary.ops) if name.startswith("coalesced")]
    _assume_cut_calls_agree(calls, oldest, coalesced=np.flatnonzero(np.isin(op_of, coalesced)))
    return calls


def _oldest_records(entries: Entries) -> np.ndarray:
    """Per rank (index), the oldest record id still in its ring; -1 for a rank with no entries."""
    if not len(entries):
        return np.zeros(0, dtype=np.int64)
    oldest = np.full(int(entries.rank.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(oldest, entries.rank, entries.record.astype(np.int64))
    oldest[oldest == np.iinfo(np.int64).max] = -1
    return oldest


def _assume_cut_calls_agree(calls: Calls, oldest: np.ndarray, coalesced: np.ndarray) -> None:
    """Give each coalesced call that holds its rank's oldest entry, on a rank whose ring wrapped,
    the value most of the other ranks have at that (group, seq)."""
    cut = np.flatnonzero((calls.record == oldest[calls.rank]) & (oldest[calls.rank] > 0)
                         & np.isin(calls.value, coalesced))
    for row in cut.tolist():  # calls are sorted by (group, seq): the same call of the peers is a slice
        group, seq = calls.group[row], calls.seq[row]
        lo, hi = np.searchsorted(calls.group, group, "left"), np.searchsorted(calls.group, group, "right")
        same = np.arange(lo + np.searchsorted(calls.seq[lo:hi], seq, "left"),
                         lo + np.searchsorted(calls.seq[lo:hi], seq, "right"))
        others = calls.value[same[same != row]]
        if len(others):
            values, counts = np.unique(others, return_counts=True)
            calls.value[row] = values[np.argmax(counts)]


def _coalesce(part: Entries, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per call: its one entry's codes, or for a coalesced call new codes naming its members."""
    vocab = part.vocabulary
    ends = np.append(starts[1:], len(part))
    ops, shapes, dtypes = [], [], []
    for begin, end in zip(starts.tolist(), ends.tolist()):
        if end - begin == 1:
            ops.append(vocab.ops[part.op[begin]])
            shapes.append(vocab.shapes[part.shape[begin]])
            dtypes.append(vocab.text("dtypes", part.dtype[begin]))
            continue
        members = [i for i in range(begin, end) if vocab.ops[part.op[i]] != "coalesced"]
        ops.append("coalesced(" + ",".join(vocab.ops[part.op[i]] for i in members) + ")")
        shapes.append("[" + ",".join(vocab.text("shapes", part.shape[i]) for i in members) + "]")
        dtypes.append("[" + ",".join(vocab.text("dtypes", part.dtype[i]) for i in members) + "]")
    return vocab.codes("ops", ops), vocab.codes("shapes", shapes), vocab.codes("dtypes", dtypes)
