"""Stragglers: a rank that arrives last at its collectives, by more than the run's own noise.

A rank's lateness in a collective is how much later it created the collective than its peers'
median. Creation times are exact, where the start and completion times torch records come from its
watchdog's polling (100 ms apart with NCCL) and are too coarse. They are read on each rank's own
clock: the stored path moves them onto the aligned clock first (``clock_offsets``), and a dump
directory assumes clocks synchronized better than the lateness (NTP on one cluster), with the
clock error bound, when known, added to the threshold. A rank is a straggler when its median
lateness exceeds ``max(floor, k x the typical lateness of the other ranks, clock error)`` and it
is the last to arrive in most of its collectives; a healthy job, even with two ranks of which one
always arrives a little later, gives none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankstream.flows.diagnosis.calls import Calls

__all__ = ["Straggler", "find_stragglers"]

#: Lateness below this is never reported, whatever the noise (scheduling jitter of a healthy job).
FLOOR_NS = 1_000_000
#: How many times the other ranks' typical lateness a straggler's must be.
NOISE_FACTOR = 4.0
#: The share of its collectives in which a straggler is the last to arrive.
LAST_SHARE = 0.6


@dataclass(frozen=True)
class Straggler:
    rank: int
    median_lateness_ns: int
    last_share: float
    threshold_ns: int
    collectives: int
    source: str


def _segment_medians(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted by (key, value): the order, each segment's start, and each segment's median."""
    order = np.lexsort((values, keys))
    keys = keys[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    sizes = np.diff(np.r_[starts, len(keys)])
    sorted_values = values[order]
    medians = (sorted_values[starts + (sizes - 1) // 2] + sorted_values[starts + sizes // 2]) / 2
    return order, starts, medians


def find_stragglers(calls: Calls, members: dict[int, int], *, clock_error_ns: int = 0) -> list[Straggler]:
    """``members``: group code -> member count (only collectives every member logged are used)."""
    if not len(calls):
        return []
    source = "creation times"
    key = calls.group.astype(np.int64) * (int(calls.seq.max()) + 1) + calls.seq
    measure = calls.created.astype(np.float64)
    order, starts, medians = _segment_medians(key, measure)
    sizes = np.diff(np.r_[starts, len(order)])
    wanted = np.array([members.get(int(g), 0) for g in calls.group[order][starts]])
    complete = np.repeat((sizes == wanted) & (sizes > 1), sizes)
    late = measure[order] - np.repeat(medians, sizes)
    ranks = calls.rank[order]
    last_rows = (starts + sizes - 1)[(sizes == wanted) & (sizes > 1)]
    last = np.bincount(ranks[last_rows], minlength=int(calls.rank.max()) + 1)
    ranks, late = ranks[complete], late[complete]
    if not len(ranks):
        return []
    rank_order, rank_starts, rank_medians = _segment_medians(ranks.astype(np.int64), late)
    _, _, typical = _segment_medians(ranks.astype(np.int64), np.abs(late))
    who = ranks[rank_order][rank_starts]
    counts = np.diff(np.r_[rank_starts, len(ranks)])
    found = []
    for i, rank in enumerate(who.tolist()):
        others = np.delete(typical, i)
        noise = float(np.median(others)) if len(others) else 0.0
        threshold = max(FLOOR_NS, NOISE_FACTOR * noise, clock_error_ns)
        share = float(last[rank]) / float(counts[i])
        if rank_medians[i] > threshold and share >= LAST_SHARE:
            found.append(Straggler(int(rank), int(rank_medians[i]), share, int(threshold), int(counts[i]), source))
    return sorted(found, key=lambda s: -s.median_lateness_ns)
