"""Stragglers: a rank that keeps its peers waiting, by more than the run's own noise.

The measure is each rank's *own delay*: how long it took to create a collective after it could
have left its previous one. A collective cannot complete before its last member arrives, so a
rank is free to leave its previous collective at the latest creation time among that
collective's members (its *release*). The delay is then ``created - release``, and its *excess* is
the delay minus the median delay of the collective's other members.

Judging delays rather than arrival times is what keeps the culprit apart from its victims: a rank
that waited for a straggler in one group arrives late in the next group too, but only because it
was released late; its own delay there is normal, and in the group it shares with the straggler
its excess is negative. Creation times are exact, where the start and completion times torch
records come from its watchdog's polling (100 ms apart with NCCL) and are too coarse. They are
read on each rank's own clock: the stored path moves them onto the aligned clock first
(``clock_offsets``), and the clock error bound, when known, is added to the threshold.

A rank is a straggler when the trimmed mean of its excesses (the top and bottom tenth left out, so
one long pause is not a trend) is both *significant* and *material*:

* significant: above ``k`` times the standard error such a mean has on the other ranks. The error
  comes from batch means (the rank's excesses in creation order, cut into ``BATCHES`` stretches,
  and the spread of the stretches' means), because excesses are not independent: with NCCL a
  rank's CPU runs ahead of its GPU and its creation times drift for many collectives. A rank
  that sleeps before each step and then keeps pace is late in only some of its collectives, but
  in every stretch, so its mean stands out all the same;
* material: above ``RELATIVE_FLOOR`` of the run's typical own delay, above ``FLOOR_NS``, and above
  the clock error (two ranks' clocks may disagree by that much, so lateness below it is unproven).

A healthy job, even a noisy one on an overloaded host, gives none: its ranks' means stay within
their standard errors.

Creation times alone cannot tell a straggler from a rank whose host clock runs ahead of its peers'
(dumps from several hosts carry each host's own clock): both create every collective a constant
time after the others. What tells them apart is each rank's *wait*, creation to completion on its
own clock. A collective completes for every member once the last one arrives, so a straggler waits
less than its peers by about its lateness, while a rank whose clock is merely ahead waits as long
as they do. Where the dumps record completion times, a rank is a straggler only if its waits fall
short of its peers' by at least half its lateness; waits as long as its peers', measured finely
enough to have seen the shortfall, mean the lateness is its clock's (both readings with four
standard errors to spare). NCCL discovers completion by polling (100 ms apart), so a short ring
may leave the question open: the finding then says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankstream.flows.diagnosis.calls import Calls

__all__ = ["Straggler", "find_stragglers"]

#: Excess below this is never reported, whatever the noise (scheduling jitter of a healthy job).
FLOOR_NS = 1_000_000
#: How many standard errors of its mean a straggler's lateness must be.
NOISE_FACTOR = 4.0
#: How many stretches a rank's excesses are cut into to estimate that standard error.
BATCHES = 8
#: Lateness below this share of the run's median own delay is not worth reporting.
RELATIVE_FLOOR = 0.1
#: The share of a rank's excesses left out at each end before averaging them.
TRIM = 0.1
#: A rank needs this many judged collectives before it can be called a straggler: three per
#: stretch, or a stretch's "mean" is one or two values and the standard error is a guess.
MIN_COLLECTIVES = 3 * BATCHES


@dataclass(frozen=True)
class Straggler:
    rank: int
    #: The trimmed mean of its excess delay over its peers'.
    lateness_ns: int
    #: The share of its collectives in which its excess exceeded the threshold.
    late_share: float
    threshold_ns: int
    collectives: int
    source: str
    #: How much less than its peers it waits inside its collectives (own clock), and whether that
    #: confirms the lateness (None: no completion times, or too coarse to tell).
    shortfall_ns: int | None = None
    confirmed: bool | None = None


def _segments(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and sizes of the runs of equal ``keys`` (already grouped)."""
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return starts, np.diff(np.r_[starts, len(keys)])


def _release_delays(calls: Calls, members: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per call (rows as in ``calls``): its collective's number and the rank's own delay (NaN where
    the previous collective is unknown or was not logged by every member)."""
    created = calls.created.astype(np.float64)
    key = calls.group.astype(np.int64) * (int(calls.seq.max()) + 1) + calls.seq
    starts, sizes = _segments(key)  # calls are sorted by (group, seq, rank)
    collective = np.repeat(np.arange(len(starts)), sizes)
    wanted = np.array([members.get(int(g), 0) for g in calls.group[starts]])
    release = np.maximum.reduceat(created, starts)
    release[(sizes != wanted) | (sizes < 2)] = np.nan
    by_rank = np.lexsort((calls.record, created, calls.rank))
    previous = np.full(len(calls), -1)
    same_rank = calls.rank[by_rank[1:]] == calls.rank[by_rank[:-1]]
    previous[by_rank[1:][same_rank]] = by_rank[:-1][same_rank]
    delay = np.full(len(calls), np.nan)
    known = previous >= 0
    delay[known] = created[known] - release[collective[previous[known]]]
    delay[np.isnan(release[collective])] = np.nan  # judged only where every member logged it
    return collective, delay


def _excess_over_others(collective: np.ndarray, delay: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, excess): each judged call's delay minus the median delay of its collective's other
    judged members (the leave-one-out median, computed on sorted segments)."""
    rows = np.flatnonzero(~np.isnan(delay))
    order = rows[np.lexsort((delay[rows], collective[rows]))]
    values = delay[order]
    starts, sizes = _segments(collective[order])
    start, size = np.repeat(starts, sizes), np.repeat(sizes, sizes)
    position = np.arange(len(order)) - start
    lo, hi = (size - 2) // 2, (size - 1) // 2
    lo_at = start + lo + (lo >= position)
    hi_at = start + hi + (hi >= position)
    judged = size > 1
    others = (values[np.minimum(lo_at, len(values) - 1)] + values[np.minimum(hi_at, len(values) - 1)]) / 2
    return order[judged], (values - others)[judged]


def _trimmed_mean(values: np.ndarray) -> float:
    cut = int(len(values) * TRIM)
    ordered = np.sort(values)
    return float(ordered[cut:len(ordered) - cut].mean())


def find_stragglers(calls: Calls, members: dict[int, int], *, clock_error_ns: int = 0) -> list[Straggler]:
    """``members``: group code -> member count (only collectives every member logged are judged)."""
    if not len(calls):
        return []
    collective, delay = _release_delays(calls, members)
    waits: dict[int, np.ndarray] | None = None  # worked out only for a run that has a suspect
    rows, excess = _excess_over_others(collective, delay)
    if not len(rows):
        return []
    material = max(FLOOR_NS, clock_error_ns, RELATIVE_FLOOR * float(np.nanmedian(delay)))
    by_rank = _by_rank(calls, rows, excess)
    error = {rank: _batch_error(values) for rank, values in by_rank.items() if len(values) >= MIN_COLLECTIVES}
    found = []
    for rank, values in by_rank.items():
        others = [e for r, e in error.items() if r != rank]
        if rank not in error or not others:
            continue
        threshold = max(material, NOISE_FACTOR * float(np.median(others)))
        lateness = _trimmed_mean(values)
        if lateness <= threshold:
            continue
        if waits is None:
            waits = _wait_excesses(calls, collective)
        shortfall, confirmed = _judged_by_waits(waits.get(rank), lateness)
        if confirmed is False:
            continue  # it waits as long as its peers: its clock, not its pace, puts it last
        found.append(Straggler(rank, int(lateness), float(np.mean(values > threshold)), int(threshold),
                               len(values), "creation times", shortfall, confirmed))
    return sorted(found, key=lambda s: -s.lateness_ns)


def _wait_excesses(calls: Calls, collective: np.ndarray) -> dict[int, np.ndarray]:
    """rank -> its waits (creation to completion, own clock) minus the median of the other members'
    with a known wait, per collective, in creation order; for the ranks with enough of them."""
    waited = calls.waited.astype(np.float64) * 1000
    waited[calls.waited < 0] = np.nan
    rows, excess = _excess_over_others(collective, waited)
    return {rank: values for rank, values in _by_rank(calls, rows, excess).items() if len(values) >= MIN_COLLECTIVES}


def _by_rank(calls: Calls, rows: np.ndarray, values: np.ndarray) -> dict[int, np.ndarray]:
    """rank -> its ``values`` (one per row of ``rows``), in creation order."""
    if not len(rows):
        return {}
    ranks = calls.rank[rows]
    order = np.lexsort((calls.created[rows], ranks))
    starts, sizes = _segments(ranks[order])
    return {int(ranks[order[start]]): values[order[start:start + size]]
            for start, size in zip(starts.tolist(), sizes.tolist())}


def _judged_by_waits(excesses: np.ndarray | None, lateness: float) -> tuple[int | None, bool | None]:
    """(shortfall, confirmed): how much less than its peers the rank waits, and whether that
    confirms a lateness (True), refutes it (False: the shortfall is measured finely enough and
    falls short of half of it) or cannot tell (None)."""
    if excesses is None:
        return None, None
    shortfall, error = -_trimmed_mean(excesses), NOISE_FACTOR * _batch_error(excesses)
    if shortfall - error >= lateness / 2:
        return int(shortfall), True
    if shortfall + error < lateness / 2:
        return int(shortfall), False
    return int(shortfall), None


def _batch_error(values: np.ndarray) -> float:
    """The standard error of the mean of ``values`` by batch means (see the module docstring)."""
    means = np.array([batch.mean() for batch in np.array_split(values, BATCHES)])
    return float(means.std(ddof=1) / np.sqrt(BATCHES))
