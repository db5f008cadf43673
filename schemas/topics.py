"""Topic names and message keys, defined once.

Each stream has its own topic so a reader that only needs Flight Recorder data and heartbeats
(the hang detector) never reads trace events. The message key is ``<run_id>/<rank>``: Kafka's
default partitioner hashes it, so one rank's messages stay ordered in one partition.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankstream.schemas.envelope import Stream

__all__ = ["Record", "topic_for", "all_topics", "requests_topic", "stored_topic", "message_key", "parse_message_key"]


@dataclass(frozen=True, slots=True)
class Record:
    """One message as read from a partition: its coordinates and its raw bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


def topic_for(prefix: str, stream: Stream) -> str:
    return f"{prefix}.{stream.value}"


def all_topics(prefix: str) -> list[str]:
    return [topic_for(prefix, stream) for stream in Stream]


def requests_topic(prefix: str) -> str:
    """Where ``rankstream profile`` asks running ranks for windows: not an event stream, so it is
    not in :func:`all_topics` and the materializer never reads it."""
    return f"{prefix}.requests"


def stored_topic(prefix: str) -> str:
    """Where the materializer says which messages it stored (``schemas.stored``): producers keep
    what the broker acknowledged until they read it there. Not an event stream either."""
    return f"{prefix}.stored"


def message_key(run_id: str, rank: int) -> bytes:
    return f"{run_id}/{rank}".encode()


def parse_message_key(key: bytes | None) -> tuple[str | None, int | None]:
    """Best-effort ``(run_id, rank)`` from a key, for labelling rejects; never raises."""
    if not key:
        return None, None
    try:
        run_id, _, rank = key.decode("utf-8", "replace").rpartition("/")
        return (run_id or None), int(rank)
    except ValueError:
        return None, None
