"""What the ranks' live stacks say about calls the Flight Recorder does not record.

The tap publishes a rank's Python stack when its groups stop moving (``idle_outside_collectives``,
``stalled_in_collective``, see ``producers.flight_recorder``). gloo records no send or receive in
the Flight Recorder, so a rank blocked in ``dist.recv`` looks, from the entries alone, like a rank
that went nowhere: both are absent from the call their peers wait in. Its stack tells them apart:
blocked in a point-to-point call, it waits for a peer; the rank that stalled elsewhere is the one
the others wait for (live probe 10 e03: a pipeline stage that stopped sending, and the next stage
blocked in its receive, were two equal suspects and the headline went by rank order).

A stack counts only while it is current: the rank's last heartbeat must report the same progress
of its groups as when the stack was taken (a rank that moved on since says nothing by it).
"""

from __future__ import annotations

import json

__all__ = ["STACK_SQL", "blocked_in_unrecorded_calls", "innermost_call"]

#: The newest stack a rank's tap published.
STACK_SQL = """
SELECT args FROM trace_events WHERE run_id = $run AND rank = $rank AND cat = 'rankstream'
  AND name IN ('idle_outside_collectives', 'stalled_in_collective') ORDER BY ts_ns DESC LIMIT 1
"""

#: Per rank, the newest published stack and the groups' progress on its newest heartbeat.
_CURRENT_SQL = """
WITH stacks AS (
    SELECT rank, arg_max(args, ts_ns) AS args FROM trace_events
    WHERE run_id = $run AND cat = 'rankstream' AND name IN ('idle_outside_collectives', 'stalled_in_collective')
    GROUP BY rank
), claims AS (
    SELECT rank, arg_max(collectives, sent_ns) FILTER (WHERE collectives IS NOT NULL) AS collectives
    FROM heartbeats WHERE run_id = $run GROUP BY rank
)
SELECT rank, stacks.args::VARCHAR, claims.collectives::VARCHAR FROM stacks LEFT JOIN claims USING (rank)
"""

#: ``torch.distributed`` functions that block on one peer and leave no Flight Recorder entry with gloo.
_POINT_TO_POINT = {"send", "recv", "send_object_list", "recv_object_list"}


def innermost_call(frames: list[dict]) -> tuple[str, str] | None:
    """``(function, "file:line, from caller:line")`` of the innermost ``torch.distributed``
    point-to-point call on a stack (innermost frame first), or None."""
    for i, frame in enumerate(frames):
        filename = str(frame.get("filename", "")).replace("\\", "/")
        if "torch/distributed/" in filename and frame.get("name") in _POINT_TO_POINT:
            caller = next((f for f in frames[i + 1:] if "torch/distributed/" not in str(f.get("filename", ""))),
                          None)
            where = f"{filename.rsplit('/', 1)[-1]}:{frame.get('line')}"
            if caller is not None:
                where += f", from {str(caller.get('filename', '')).rsplit('/', 1)[-1]}:{caller.get('line')}"
            return str(frame["name"]), where
    return None


def blocked_in_unrecorded_calls(database, run_id: str) -> dict[int, str]:
    """rank -> "recv (distributed_c10d.py:2799, from train.py:37)" for the ranks whose current
    stack shows them blocked in a point-to-point call."""
    found = {}
    for rank, args, claims in database.fetchall(_CURRENT_SQL, {"run": run_id}):
        try:
            published = json.loads(args or "{}")
            current = claims is not None and json.loads(claims) == published.get("groups")
        except ValueError:  # a malformed event says nothing
            continue
        call = innermost_call(published.get("frames") or []) if current else None
        if call is not None:
            found[rank] = f"{call[0]} ({call[1]})"
    return found
