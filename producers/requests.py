"""Requests to running ranks over the bus, with no daemon: ``rankstream profile`` asks named ranks
of a run for a profiler window.

A request is a small JSON object on ``<prefix>.requests``, a topic the materializer does not read
(it is no event). Each rank that started a session follows that topic (``producers.topic_tail``)
(through its producer's topic tail) and hands the requests for its run and rank to the session.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable


__all__ = ["RequestListener", "profile_request", "decode_request"]

def profile_request(run_id: str, ranks: list[int] | None, active: int) -> dict[str, Any]:
    """A request for a window of ``active`` steps on ``ranks`` (all ranks when None)."""
    return {"kind": "profile", "id": uuid.uuid4().hex[:12], "run_id": run_id, "ranks": ranks, "active": active,
            "sent_ns": time.time_ns()}


def decode_request(raw: bytes | None) -> dict[str, Any] | None:
    """The request in ``raw``, or None for anything that is not one (it is ignored)."""
    try:
        request = json.loads(raw or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(request, dict) or request.get("kind") != "profile" or not isinstance(request.get("id"), str):
        return None
    ranks, active = request.get("ranks"), request.get("active")
    if ranks is not None and not (isinstance(ranks, list) and all(isinstance(r, int) for r in ranks)):
        return None
    if not isinstance(active, int) or not 1 <= active <= 1000:
        return None
    return request


class RequestListener:
    """Given the requests topic's messages; calls ``on_request(request)`` for this rank's."""

    def __init__(self, run_id: str, *, rank: int, on_request: Callable[[dict], None]) -> None:
        self._run_id, self._rank, self._on_request = run_id, rank, on_request

    def received(self, raw: bytes | None) -> None:
        request = decode_request(raw)
        if request and request["run_id"] == self._run_id and (request["ranks"] is None or self._rank in request["ranks"]):
            self._on_request(request)
