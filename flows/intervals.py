"""Unions of time intervals in numpy, for the GPU analyses.

HTA merges intervals that touch as well as those that overlap, so a union here does the same:
figures then agree with HTA's to the nanosecond.
"""

from __future__ import annotations

import numpy as np

__all__ = ["merged_intervals", "covered_ns"]


def merged_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as disjoint sorted intervals; touching ones are merged."""
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    first = np.flatnonzero(np.r_[True, starts[1:] > reach[:-1]])
    last = np.r_[first[1:] - 1, len(starts) - 1]
    return starts[first], reach[last]


def covered_ns(union: tuple[np.ndarray, np.ndarray], starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each interval [starts[i], ends[i]), how much of it ``union`` (disjoint, sorted, from
    ``merged_intervals``) covers: the union's length up to ``ends`` minus its length up to
    ``starts``, each found by a binary search, so millions of intervals cost two searches each."""
    union_starts, union_ends = union
    if not len(union_starts):
        return np.zeros(len(starts), dtype=np.int64)
    lengths = union_ends - union_starts
    before = np.r_[0, np.cumsum(lengths)]  # before[i]: the union's length before its interval i

    def length_up_to(times: np.ndarray) -> np.ndarray:
        index = np.searchsorted(union_starts, times, side="right") - 1  # the last union interval starting by then
        last = np.maximum(index, 0)
        return np.where(index >= 0, before[last] + np.clip(times - union_starts[last], 0, lengths[last]), 0)

    return length_up_to(ends) - length_up_to(starts)
