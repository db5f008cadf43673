"""One group's calls seen as sequences: each rank's, and the group's consensus.

Training repeats itself: a group's calls follow a period (the collectives of one step, or of one
layer). The period learned from the calls everyone agreed on predicts what the group would have
issued next, which is how a rank that skipped a collective at the newest (still running) call is
told from one that issued a wrong one, with nothing after it to compare.
"""

from __future__ import annotations

from collections import Counter
from functools import cached_property

import numpy as np

from rankstream.flows.diagnosis.calls import Calls
from rankstream.flows.diagnosis.groups import Group

__all__ = ["GroupSequences", "split_by_group", "period_of"]

#: The longest period looked for, in calls.
_MAX_PERIOD = 96
#: How many of the latest agreed calls a period must explain.
_CHECKED = 48
#: Fewer agreed calls than that: the fewest a periodic stretch after the set-up calls must hold.
_SHORT_RUN = 12


class GroupSequences:
    """The calls of one group: ``calls`` rows ``[lo, hi)`` (sorted by seq, then rank)."""

    def __init__(self, group: Group, calls: Calls, lo: int, *, hi: int) -> None:
        self.group = group
        self._seq = calls.seq[lo:hi]
        self._rank = calls.rank[lo:hi]
        self._value = calls.value[lo:hi]
        self._op = calls.op[lo:hi]
        self._state = calls.state[lo:hi]
        self._lo = lo  # row of the first call in the run's Calls
        self._consensus: dict[int, int] | None = None

    # -- whole-group views (numpy) ------------------------------------------------------------
    @cached_property
    def _segments(self) -> np.ndarray:
        """Start index of each sequence number's calls."""
        seq = self._seq
        return np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]]) if len(seq) else np.zeros(0, dtype=np.int64)

    def first_disagreement(self) -> int | None:
        """The lowest sequence number at which the calls present differ, or None."""
        if not len(self._seq):
            return None
        starts = self._segments
        low, high = np.minimum.reduceat(self._value, starts), np.maximum.reduceat(self._value, starts)
        differ = np.flatnonzero(low != high)
        return int(self._seq[starts[differ[0]]]) if len(differ) else None

    def ranks(self) -> list[int]:
        return np.unique(self._rank).tolist()

    def last_seq(self) -> dict[int, int]:
        """Each rank's newest sequence number in the group."""
        order = np.lexsort((self._seq, self._rank))
        rank, seq = self._rank[order], self._seq[order]
        last = np.r_[rank[1:] != rank[:-1], True] if len(rank) else np.zeros(0, dtype=bool)
        return dict(zip(rank[last].tolist(), seq[last].tolist()))

    def first_seq(self) -> dict[int, int]:
        """Each rank's oldest sequence number still in its ring buffer."""
        order = np.lexsort((self._seq, self._rank))
        rank, seq = self._rank[order], self._seq[order]
        first = np.r_[True, rank[1:] != rank[:-1]] if len(rank) else np.zeros(0, dtype=bool)
        return dict(zip(rank[first].tolist(), seq[first].tolist()))

    # -- one sequence number ------------------------------------------------------------------
    def _at(self, seq: int) -> slice:
        lo, hi = np.searchsorted(self._seq, [seq, seq + 1])
        return slice(int(lo), int(hi))

    def values_at(self, seq: int) -> dict[int, int]:
        at = self._at(seq)
        return dict(zip(self._rank[at].tolist(), self._value[at].tolist()))

    def usual_at(self, seq: int) -> int | None:
        """The value most members issued at ``seq`` (ties: the lowest value), None if nobody did."""
        votes = Counter(self.values_at(seq).values())
        return max(votes.items(), key=lambda kv: (kv[1], -kv[0]))[0] if votes else None

    def states_at(self, seq: int) -> dict[int, int]:
        at = self._at(seq)
        return dict(zip(self._rank[at].tolist(), self._state[at].tolist()))

    def rows_at(self, seq: int) -> dict[int, int]:
        """rank -> row in the run's ``Calls`` (for its times and record)."""
        at = self._at(seq)
        return dict(zip(self._rank[at].tolist(), range(self._lo + at.start, self._lo + at.stop)))

    # -- per-rank and consensus sequences (built only for groups that need them) -------------
    def calls_of(self, rank: int) -> dict[int, int]:
        mine = self._rank == rank
        return dict(zip(self._seq[mine].tolist(), self._value[mine].tolist()))

    def consensus(self, exclude: set[int] = frozenset()) -> dict[int, int]:
        """seq -> the value most of the other ranks issued there (ties: the lowest value). Without
        ``exclude`` it is worked out once: every rank waiting in a call asks for it."""
        if not exclude and self._consensus is not None:
            return self._consensus
        keep = ~np.isin(self._rank, list(exclude)) if exclude else slice(None)
        seq, value = self._seq[keep].astype(np.int64), self._value[keep].astype(np.int64)
        found: dict[int, int] = {}
        if len(seq):
            span = int(value.max()) + 1
            keys, counts = np.unique(seq * span + value, return_counts=True)
            seqs, values = np.divmod(keys, span)
            order = np.lexsort((values, -counts, seqs))  # per seq: the most votes, then the lowest value
            first = order[np.r_[True, seqs[order][1:] != seqs[order][:-1]]]
            found = dict(zip(seqs[first].tolist(), values[first].tolist()))
        if not exclude:
            self._consensus = found
        return found

    def ops_seen(self, exclude: set[int] = frozenset()) -> set[int]:
        keep = ~np.isin(self._rank, list(exclude)) if exclude else slice(None)
        return set(np.unique(self._op[keep]).tolist())

    def predicted_before(self, seq: int, *, at: int | None = None) -> int | None:
        """What the group's agreed calls before ``seq`` predict at ``at`` (``seq`` by default)."""
        history = {number: value for number, value in self.consensus().items() if number < seq}
        return self.predicted(history, seq if at is None else at)

    def predicted(self, consensus: dict[int, int], seq: int) -> int | None:
        """What the group issued at ``seq``, or, past its calls, what its period predicts."""
        if seq in consensus:
            return consensus[seq]
        period = period_of(consensus)
        if period is None:
            return None
        for back in range(seq - period, min(consensus, default=seq) - 1, -period):
            if back in consensus:
                return consensus[back]
        return None


def period_of(consensus: dict[int, int]) -> int | None:
    """The shortest period the group's latest agreed calls repeat with (at least two periods seen).

    At least three periods and ``_CHECKED`` calls: a step's pattern repeats within it too
    (all-gather, reduce-scatter, ...), which a short window would take for the period. A group
    with fewer calls than that is young, and opens with set-up calls that never repeat (DDP's
    broadcasts): there the periodic stretch that ends its history must hold three periods,
    ``_SHORT_RUN`` calls and at least half of the history."""
    if len(consensus) < 2:
        return None
    seqs = sorted(consensus)
    values = [consensus[s] for s in seqs]
    periods = range(1, min(_MAX_PERIOD, len(values) // 2) + 1)
    for period in periods:
        tail = values[-min(len(values), max(3 * period, _CHECKED)):]
        if all(tail[i] == tail[i - period] for i in range(period, len(tail))):
            return period
    if len(values) >= _CHECKED:
        return None
    for period in periods:
        run = _periodic_suffix(values, period)
        if run >= max(3 * period, _SHORT_RUN) and 2 * run >= len(values):
            return period
    return None


def _periodic_suffix(values: list, period: int) -> int:
    """How many of the last ``values`` repeat with ``period``."""
    for i in range(len(values) - 1, period - 1, -1):
        if values[i] != values[i - period]:
            return len(values) - (i - period + 1)
    return len(values)


def split_by_group(calls: Calls, groups: dict[int, Group]) -> dict[int, GroupSequences]:
    """Every group's ``GroupSequences`` (``calls`` is sorted by group)."""
    starts = np.flatnonzero(np.r_[True, calls.group[1:] != calls.group[:-1]]) if len(calls) else []
    ends = list(starts[1:]) + [len(calls)] if len(calls) else []
    return {int(calls.group[lo]): GroupSequences(groups[int(calls.group[lo])], calls, int(lo), hi=int(hi))
            for lo, hi in zip(starts, ends) if int(calls.group[lo]) in groups}
