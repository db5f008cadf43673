"""How far each rank's stored Flight Recorder entries go, judged against its own heartbeats.

A rank's tap reads its groups' progress every tick and puts it on the heartbeats, but it dumps the
ring only when something changed. So a rank blocked in a collective stops dumping: its last dump
is seconds old while its heartbeats keep saying "nothing new". Two questions follow, and both are
answered by comparing the newest heartbeat's claims (last enqueued collective per group) with the
entries stored for that rank:

* **in flight**: the rank claims a call whose entry is not stored yet (it travels on another
  topic), so judging it now would blame it for a call it did issue;
* **known until**: when its claims are all stored, its ring held nothing else when that progress
  was read, so its entries are complete up to that read, not only up to its last dump. The live
  diagnosis compares ranks only up to the earliest such moment (``stored.load_stored``): using the
  last dump instead would leave out the calls that its peers made after it blocked, and blame them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

__all__ = ["RingProgress", "ring_progress"]

#: Per rank with entries or heartbeats: its newest heartbeat's claims and when they were read, its
#: newest dump, and the last collective stored per group (keyed by ``pg_id``, as the claims are), in
#: the claims' numbering: gloo claims the ``op_id`` of its last recorded call, which also counts the
#: send/recv it does not record; other backends claim the collective's sequence number.
_PROGRESS_SQL = """
WITH claimed AS (
    SELECT rank, arg_max(collectives, sent_ns) FILTER (WHERE collectives IS NOT NULL) AS collectives,
           arg_max(collectives_read_ns, sent_ns) FILTER (WHERE collectives IS NOT NULL) AS read_ns
    FROM heartbeats WHERE run_id = $run GROUP BY rank
), stored AS (
    SELECT rank, pg_id::VARCHAR AS pg, max(CASE WHEN profiling_name LIKE 'gloo:%' THEN coalesce(op_id, collective_seq_id)
                                                ELSE collective_seq_id END) AS seq, max(snapshot_ns) AS dumped_ns
    FROM fr_entries WHERE run_id = $run GROUP BY ALL
), ranks AS (SELECT rank FROM claimed UNION SELECT rank FROM stored)
SELECT rank, any_value(claimed.collectives), any_value(claimed.read_ns), max(stored.dumped_ns),
       list(stored.pg) FILTER (WHERE stored.pg IS NOT NULL), list(stored.seq) FILTER (WHERE stored.pg IS NOT NULL),
       bool_or(claimed.rank IS NOT NULL)
FROM ranks LEFT JOIN claimed USING (rank) LEFT JOIN stored USING (rank) GROUP BY rank
"""


@dataclass
class RingProgress:
    #: Ranks whose heartbeat claims a collective beyond the last one stored for its group, or that
    #: heartbeat without any progress yet (their tap has not reported: what they did is unknown).
    in_flight: set[int] = field(default_factory=set)
    #: Rank (with stored entries) -> until when its ring is known in full: the read time of its
    #: newest claims when they are all stored, else its newest dump.
    known_until: dict[int, int] = field(default_factory=dict)


def ring_progress(database, run_id: str) -> RingProgress:
    progress = RingProgress()
    for rank, claimed, read_ns, dumped_ns, groups, seqs, heartbeats in database.fetchall(_PROGRESS_SQL,
                                                                                        {"run": run_id}):
        behind = _claims_beyond(claimed, dict(zip(groups or (), seqs or ()))) if heartbeats else False
        if behind:
            progress.in_flight.add(rank)
        if dumped_ns is not None:
            complete_at = read_ns if behind is False and read_ns is not None else None
            progress.known_until[rank] = max(dumped_ns, complete_at or dumped_ns)
    return progress


def _claims_beyond(claimed: str | None, stored: dict[str, int]) -> bool | None:
    """True when the claims name a collective not stored, None when there are no readable claims
    (unknown), False when every claimed collective is stored."""
    if claimed is None:
        return True  # heartbeats, but the tap has not reported: what the rank did is unknown
    try:
        status = json.loads(claimed)
    except ValueError:
        return None  # a heartbeat without readable progress claims nothing
    if not isinstance(status, dict):
        return None
    for group, state in status.items():
        enqueued = state.get("last_enqueued") if isinstance(state, dict) else None
        last = stored.get(group)
        if isinstance(enqueued, int) and enqueued > (last if last is not None else -1):
            return True
    return False
