"""A hang the Flight Recorder cannot show: ranks blocked in transfers, with no collective pending.

gloo records no send or receive, so a job whose ranks all wait in transfers (a pipeline that uses
no collective, a stage that stalled in its own code, a send to the wrong stage) leaves no entry in
flight, and the entries alone say the job was healthy (live probe 13: three such hangs, killed
after 190 s, ended "HEALTHY"). The ranks' current live stacks (``published_stacks``) say more:
each rank blocked in a transfer names its peer, and following those names from a blocked rank ends

* at a rank in its own code, or one with no current stack: it never posted its side, and the
  ranks on the way wait for it;
* in a cycle of transfers: a send whose receiver waits for another sender went to the wrong rank;
  otherwise the ranks of the cycle wait for each other.

Only used after the job, when the entries found nothing and some rank did not end cleanly (a job
whose ranks all said goodbye was not hung, whatever their last stacks showed).
"""

from __future__ import annotations

from rankstream.flows.diagnosis.findings import Finding, ranks_text
from rankstream.flows.diagnosis.published_stacks import BlockedCall, OutsideCommunication

__all__ = ["blocked_transfer_findings"]


def blocked_transfer_findings(places: dict[int, BlockedCall | OutsideCommunication]) -> list[Finding]:
    """Findings from where the ranks' current stacks show them (see the module docstring)."""
    blocked = {rank: call for rank, call in places.items() if isinstance(call, BlockedCall) and call.point_to_point}
    if not blocked:
        return []
    waiting_for: dict[int, list[int]] = {}
    cycles: list[list[int]] = []
    for start in sorted(blocked):
        path, rank = [], start
        while rank in blocked and rank not in path and blocked[rank].peer is not None:
            path.append(rank)
            rank = blocked[rank].peer
        if rank in path:  # a cycle of transfers
            cycle = sorted(path[path.index(rank):])
            if cycle not in cycles:
                cycles.append(cycle)
        elif rank not in blocked:
            waiting_for.setdefault(rank, []).extend(path)
    findings = [_never_posted(culprit, sorted(set(waiters)), blocked, places)
                for culprit, waiters in sorted(waiting_for.items())]
    findings += [_cycle(cycle, blocked) for cycle in cycles]
    return findings


def _never_posted(culprit: int, waiters: list[int], blocked: dict, places: dict) -> Finding:
    """The rank at the end of the waits: in its own code, or unseen."""
    first = next(rank for rank in waiters if blocked[rank].peer == culprit)
    op = "send" if blocked[first].function.startswith("recv") else "recv"
    place = places.get(culprit)
    return Finding(
        kind="p2p_unmatched", culprit_ranks=[culprit], expected={"op": op, "peer": first}, waiting_ranks=waiters,
        actual={"stalled_at": str(place)} if isinstance(place, OutsideCommunication) else None,
        in_flight=True, evidence=[f"rank {rank}'s live stack shows it blocked in {blocked[rank]}" for rank in waiters]
        + [f"rank {culprit} is in its own code at {place}: it has not posted its {op}"
           if isinstance(place, OutsideCommunication) else
           f"rank {culprit} published no current stack: it is not blocked in a transfer the others could see"]
        + ["gloo's Flight Recorder records no send or receive: only the stacks show this hang"])


def _cycle(cycle: list[int], blocked: dict) -> Finding:
    """Ranks whose transfers wait on each other: a misdirected send, or a deadlock."""
    evidence = [f"rank {rank}'s live stack shows it blocked in {blocked[rank]}" for rank in cycle]
    for rank in cycle:
        call, peer = blocked[rank], blocked[rank].peer
        if not call.function.startswith("recv") and blocked[peer].function.startswith("recv") \
                and blocked[peer].peer != rank:
            return Finding(kind="p2p_unmatched", culprit_ranks=[rank], expected={"op": "send", "peer": peer},
                           actual={"op": "send", "peer": peer, "receives_from": blocked[peer].peer},
                           waiting_ranks=[r for r in cycle if r != rank], in_flight=True, evidence=evidence + [
                               f"rank {rank} sends to rank {peer}, which receives from rank "
                               f"{blocked[peer].peer}: the send went to the wrong rank"])
    return Finding(kind="deadlock", culprit_ranks=cycle, waiting_ranks=[], in_flight=True,
                   evidence=evidence + [f"{ranks_text(cycle)} wait for each other in transfers"])
