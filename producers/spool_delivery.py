"""Sending what producers left in their spools: a job that ended while no broker was reachable.

A segment is sent whole, and each message's batch key is kept: the segment may be deleted only
once the materializer has stored every one of them (``rankstream.spools`` checks), because an
acknowledgement from the embedded broker is not enough (it keeps its log in memory). Resending a
segment is harmless: the materializer skips batch keys it already stored.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from rankstream.producers.spool import Spool
from rankstream.producers.transport import Transport
from rankstream.schemas.codec import decode
from rankstream.schemas.envelope import BatchKey

__all__ = ["SentSegment", "send_segment"]


@dataclass
class SentSegment:
    path: Path
    messages: int = 0
    events: int = 0
    #: Every message's key (a message that does not decode has none: it will land in rejects).
    keys: list[BatchKey] = field(default_factory=list)
    #: Why not every message was acknowledged, if not.
    error: str | None = None


def send_segment(transport: Transport, path: Path, timeout_s: float = 30.0) -> SentSegment:
    """Send every message of ``path`` and wait for the broker's acknowledgements."""
    sent = SentSegment(path)
    failures: list[str] = []
    acknowledged = threading.Semaphore(0)

    def done(error) -> None:
        if error is not None:
            failures.append(str(error))
        acknowledged.release()

    for message in Spool.read_segment(path):
        envelope = decode(message.value)
        if hasattr(envelope, "key"):
            sent.keys.append(envelope.key)
        transport.send(message.topic, message.key, message.value, done=done)
        sent.messages += 1
        sent.events += message.events
    transport.flush(timeout_s)
    for _ in range(sent.messages):
        if not acknowledged.acquire(timeout=timeout_s):
            failures.append("no acknowledgement")
            break
    sent.error = failures[0] if failures else None
    return sent
