"""What the ranks' live stacks say about calls the Flight Recorder does not record.

The tap publishes a rank's Python stack when its groups stop moving (``idle_outside_collectives``,
``stalled_in_collective``, see ``producers.flight_recorder``). gloo records no send or receive in
the Flight Recorder, so a rank blocked in ``dist.recv`` looks, from the entries alone, like a rank
that went nowhere: both are absent from the call their peers wait in. Its stack tells them apart:
blocked in a point-to-point call, it waits for a peer; the rank that stalled elsewhere is the one
the others wait for (live probe 10 e03: a pipeline stage that stopped sending, and the next stage
blocked in its receive, were two equal suspects and the headline went by rank order). And gloo's
entries never leave ``scheduled``, so a rank still inside a collective its peers completed (a
broadcast whose ranks disagreed on its source) looks like one that never issued the next call;
its stack shows it inside (probe 10 e05).

A stack counts only while it is current: the rank's last heartbeat must report the same calls
enqueued in each group, and the same count of transfers, as when the stack was taken (a rank that
issued a call since says nothing by it). A call that completed since does not count: a rank torn
down from a hang reports its blocked call completed (with an error) on its way out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rankstream.schemas.stack_frames import C10D_MODULE

__all__ = ["STACK_SQL", "BlockedCall", "OutsideCommunication", "current_places", "innermost_call", "place_outside",
           "stacks_published_ns"]

#: The tap's events that carry a rank's stack.
_STACK_EVENTS = "cat = 'rankstream' AND name IN ('idle_outside_collectives', 'stalled_in_collective')"

#: The newest stack a rank's tap published.
STACK_SQL = f"""
SELECT args FROM trace_events WHERE run_id = $run AND rank = $rank AND {_STACK_EVENTS} ORDER BY ts_ns DESC LIMIT 1
"""

#: When each rank last published a stack.
_PUBLISHED_SQL = f"SELECT rank, max(ts_ns) FROM trace_events WHERE run_id = $run AND {_STACK_EVENTS} GROUP BY rank"

#: Per rank, the newest published stack (and why the tap took it) and the groups' progress on its
#: newest heartbeat.
_CURRENT_SQL = f"""
WITH stacks AS (
    SELECT rank, arg_max(args, ts_ns) AS args, arg_max(name, ts_ns) AS name FROM trace_events
    WHERE run_id = $run AND {_STACK_EVENTS} GROUP BY rank
), claims AS (
    SELECT rank, arg_max(collectives, sent_ns) FILTER (WHERE collectives IS NOT NULL) AS collectives,
           arg_max(transfers, sent_ns) AS transfers, count(*) AS heartbeats
    FROM heartbeats WHERE run_id = $run GROUP BY rank
)
SELECT rank, stacks.name, stacks.args::VARCHAR, claims.collectives::VARCHAR, claims.transfers, claims.heartbeats
FROM stacks LEFT JOIN claims USING (rank)
"""

#: ``torch.distributed`` functions that block on one peer and leave no Flight Recorder entry with
#: gloo, and the argument that names the peer (a global rank). ``wait`` stands for the job's own
#: frame waiting on an ``isend``/``irecv`` request (``schemas.stack_frames``), which names none.
_POINT_TO_POINT = {"send": "dst", "recv": "src", "send_object_list": "dst", "recv_object_list": "src", "wait": ""}
#: Collectives with a root, and the argument that names it: gloo's entries do not record it.
_ROOTED = {"broadcast": "src", "broadcast_object_list": "src", "scatter": "src", "scatter_object_list": "src",
           "reduce": "dst", "gather": "dst", "gather_object": "dst"}


@dataclass(frozen=True)
class BlockedCall:
    """The ``torch.distributed`` function a rank's live stack shows it inside."""

    function: str
    #: "distributed_c10d.py:2799, from train.py:37"
    where: str
    #: The rank the call names, when the stack gave it as a global rank: a receive's source, a
    #: send's destination, a rooted collective's root.
    peer: int | None = None

    @property
    def point_to_point(self) -> bool:
        return self.function in _POINT_TO_POINT

    @property
    def root(self) -> int | None:
        return self.peer if self.function in _ROOTED else None

    def __str__(self) -> str:
        way = " from" if self.function.startswith("recv") else " with root" if self.function in _ROOTED else " to"
        return f"{self.function}{way + ' rank ' + str(self.peer) if self.peer is not None else ''} ({self.where})"


@dataclass(frozen=True)
class OutsideCommunication:
    """A current live stack in no ``torch.distributed`` function: the rank is in its own code (a
    data loader, a checkpoint, a sleep), short of the call its peers wait in."""

    #: "train.py:41 in load_batch", or "queue.py:171 in get, from train.py:41" when the innermost
    #: frame is a library's
    where: str

    def __str__(self) -> str:
        return self.where


#: Path parts of frames that are not the job's own code.
_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")
#: torch code that communicates outside ``distributed_c10d``'s public functions: a request's
#: ``wait()`` (isend/irecv, pipelining schedules), DDP, FSDP, functional collectives, store barriers.
_COMMUNICATING = ("torch/distributed/", "torch/nn/parallel/")


def place_outside(frames: list[dict]) -> OutsideCommunication | None:
    """Where a stack in no ``torch.distributed`` function is: its innermost frame, and the job's
    own frame that led there. None for an empty stack, and for one in torch code that may be
    communicating (``_COMMUNICATING``): that rank may wait for a peer."""
    paths = [str(frame.get("filename", "?")).replace("\\", "/") for frame in frames]
    if not frames or any(part in path for path in paths for part in _COMMUNICATING):
        return None
    at = [f"{path.rsplit('/', 1)[-1]}:{frame.get('line')}" for path, frame in zip(paths, frames)]
    where = f"{at[0]} in {frames[0].get('name', '?')}"
    own = next((i for i, path in enumerate(paths) if not any(part in path for part in _LIBRARY)), 0)
    if own:  # the innermost frame is a library's: the job's own frame that called into it
        where += f", from {at[own]}"
    return OutsideCommunication(where)


def innermost_call(frames: list[dict]) -> BlockedCall | None:
    """The innermost ``torch.distributed`` collective or point-to-point function on a stack
    (innermost frame first), with where it was called from, or a request the innermost frame
    waits on; None when the stack is in none."""
    if frames and frames[0].get("waits_on_request"):
        frame = frames[0]
        return BlockedCall("wait", f"{str(frame.get('filename', '?')).rsplit('/', 1)[-1]}:{frame.get('line')} in "
                                   f"{frame.get('name', '?')}, on a request")
    for i, frame in enumerate(frames):
        filename = str(frame.get("filename", "")).replace("\\", "/")
        if filename.endswith(C10D_MODULE) and not str(frame.get("name", "_")).startswith("_"):
            caller = next((f for f in frames[i + 1:] if "torch/distributed/" not in str(f.get("filename", ""))),
                          None)
            where = f"{filename.rsplit('/', 1)[-1]}:{frame.get('line')}"
            if caller is not None:
                where += f", from {str(caller.get('filename', '')).rsplit('/', 1)[-1]}:{caller.get('line')}"
            return BlockedCall(str(frame["name"]), where, _peer(frames[i:]))
    return None


def _peer(frames: list[dict]) -> int | None:
    """The global rank the innermost ``torch.distributed`` call names, or the public function
    around it (``recv_object_list(src=1)`` calls ``recv(group_src=1)``, which names none)."""
    for frame in frames:
        if not str(frame.get("filename", "")).replace("\\", "/").endswith(C10D_MODULE):
            continue
        function = str(frame.get("name"))
        peer = (frame.get("args") or {}).get(_POINT_TO_POINT.get(function) or _ROOTED.get(function, ""))
        if type(peer) is int:
            return peer
    return None


def _enqueued(groups) -> dict | None:
    """Per group, the last call enqueued (``groups`` as the tap reports progress)."""
    if not isinstance(groups, dict):
        return None
    return {group: state.get("last_enqueued") if isinstance(state, dict) else None for group, state in groups.items()}


def stacks_published_ns(database, run_id: str) -> dict[int, int]:
    """rank -> when it last published a stack (its tap's clock, ns)."""
    return dict(database.fetchall(_PUBLISHED_SQL, {"run": run_id}))


def current_places(database, run_id: str) -> dict[int, BlockedCall | OutsideCommunication]:
    """rank -> where its current stack shows it: blocked in a ``torch.distributed`` call, or
    outside communication."""
    found = {}
    for rank, reason, args, claims, transfers, heartbeats in database.fetchall(_CURRENT_SQL, {"run": run_id}):
        try:
            published = json.loads(args or "{}")
            # a rank whose ring never reported a group (transfers alone) claims none in its heartbeats
            current = bool(heartbeats) and (_enqueued(json.loads(claims) if claims else {})
                                            == _enqueued(published.get("groups") or {}))
        except ValueError:  # a malformed event says nothing
            continue
        if published.get("transfers") not in (None, transfers):  # a transfer returned since
            current = False
        frames = published.get("frames") or [] if current else []
        place = innermost_call(frames)
        if isinstance(place, BlockedCall) and place.function == "wait":
            place = _waited_for(place, published.get("posted"))
        if place is None and reason == "idle_outside_collectives":  # the tap saw no collective pending
            place = place_outside(frames)
        if place is not None:
            found[rank] = place
    return found


def _waited_for(wait: BlockedCall, posted) -> BlockedCall:
    """A request's ``wait()`` as the transfer the rank's last ``isend``/``irecv``/
    ``batch_isend_irecv`` posted (``producers.transfer_count``): the request names no peer. Of
    several, the receive: a stage waits for its input first. Unchanged when that is not one
    transfer with a known peer."""
    if not (isinstance(posted, list) and all(isinstance(p, list) and len(p) == 2 for p in posted)):
        return wait
    transfers = {(op, peer) for op, peer in posted if op in ("send", "recv") and type(peer) is int}
    receives = {t for t in transfers if t[0] == "recv"}
    chosen = transfers if len(transfers) == 1 else receives if len(receives) == 1 else set()
    if not chosen:
        return wait
    op, peer = next(iter(chosen))
    return BlockedCall(op, wait.where, peer)
