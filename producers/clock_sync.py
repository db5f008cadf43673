"""Clock sync samples: when did every rank pass the same instant, and how sure are we.

As Composer's trace handler does, each rank reads its clock between two barriers; the reading
is "the same instant" on every rank to within the error bound, the time from entering the first
barrier to leaving the second. rankstream's barriers go through the process group's key-value
store, not through collectives, because:

* a store wait has a timeout, so a rank whose peers never join records a failure instead of
  hanging (this also makes it safe to run periodically from a background thread);
* store operations add no collectives, so Flight Recorder sequence numbers stay the job's own.

Which round to join is agreed through the store too (:class:`ClockRounds`): a rank reads the
current round number there, and whoever finishes or gives up on a round moves it on. A rank that
came late (its peers timed out waiting for it and retried) joins the round they are waiting in,
instead of the abandoned one; with private round counters the two would keep missing each other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

__all__ = ["ClockSample", "ClockRounds", "sample_clock"]


@dataclass(frozen=True)
class ClockSample:
    #: This rank's wall clock (epoch ns) at the shared instant.
    sync_ns: int
    #: Round trip of the two barriers: the reading is the shared instant +- this.
    error_ns: int
    round: int


def _store_barrier(store, key: str, world_size: int, timeout_s: float) -> None:
    arrived = store.add(f"{key}/arrived", 1)
    if arrived == world_size:
        store.set(f"{key}/open", b"1")
    else:
        store.wait([f"{key}/open"], timedelta(seconds=timeout_s))


def sample_clock(store, run_id: str, round_number: int, *, world_size: int, timeout_s: float = 10.0) -> ClockSample:
    """Two store barriers around a clock reading. Raises (after ``timeout_s``) if a peer is missing."""
    key = f"rankstream/clock/{run_id}/{round_number}"
    before = time.time_ns()
    _store_barrier(store, f"{key}/a", world_size, timeout_s)
    sync = time.time_ns()
    _store_barrier(store, f"{key}/b", world_size, timeout_s)
    after = time.time_ns()
    return ClockSample(sync_ns=sync, error_ns=after - before, round=round_number)


class ClockRounds:
    """Clock-sync rounds on a shared round number: :meth:`sample` joins the current round and
    moves the number on, whether the round succeeded (the next periodic sample uses the next one)
    or timed out (so the peers that come late meet the ones that retry)."""

    def __init__(self, store, run_id: str, world_size: int, *, timeout_s: float = 10.0) -> None:
        """``store``: the process group's store. The rounds use a connection of their own to it
        (``Store.clone``): a store client serves one request at a time, so a barrier waiting on
        the training thread's client held up the job's own store calls (``new_group``'s
        rendezvous) for as long as the wait, up to the timeout."""
        self._store = _own_connection(store)
        self._run_id = run_id
        self._world_size = world_size
        self._timeout_s = timeout_s
        self._key = f"rankstream/clock/{run_id}/round"
        #: The round last joined (None before the first).
        self.round: int | None = None

    def sample(self) -> ClockSample:
        """One round's sample; raises (after the timeout) if a peer is missing."""
        self.round = round_number = int(self._store.add(self._key, 0))  # adding 0 reads the counter
        try:
            return sample_clock(self._store, self._run_id, round_number, world_size=self._world_size, timeout_s=self._timeout_s)
        finally:  # the first rank to get here moves everyone on; the others find it done
            self._store.compare_set(self._key, str(round_number), str(round_number + 1))


def _own_connection(store):
    """A client of the same store for this thread alone, or the store itself when it has no
    clients to clone (an in-process ``HashStore``, a ``FileStore``: neither serializes waits)."""
    try:
        return store.clone()
    except (AttributeError, RuntimeError, NotImplementedError):  # no connection to clone
        return store
