"""Test doubles: an in-process stand-in for a Kafka cluster, and the transport and source that use it.

It keeps Kafka's contract where rankstream relies on it: per-partition ordered logs with offsets,
the key hashed to a partition, and readers that seek to an offset. It is not durable and not
shared between processes; integration tests use the real broker.
"""

from __future__ import annotations

import threading
import time
import zlib

from typing import Mapping

from rankstream.consumers.source import Position
from rankstream.producers.transport import Done
from rankstream.schemas.topics import Record

__all__ = ["MemoryBus", "MemoryTransport", "MemorySource"]


class MemoryBus:
    def __init__(self, partitions: int = 4) -> None:
        self.partitions = partitions
        self._logs: dict[str, list[list[Record]]] = {}
        self._lock = threading.Lock()
        #: While False, every send fails as if the broker were unreachable.
        self.available = True
        #: Bumped by ``restart()``; stands for the topic ids a real broker gives recreated topics.
        self.incarnation = 1

    def _topic(self, topic: str) -> list[list[Record]]:
        if topic not in self._logs:
            self._logs[topic] = [[] for _ in range(self.partitions)]
        return self._logs[topic]

    def append(self, topic: str, key: bytes | None, value: bytes | None) -> Record:
        if not self.available:
            raise ConnectionError("memory bus is unavailable")
        with self._lock:
            logs = self._topic(topic)
            partition = zlib.crc32(key or b"") % self.partitions
            record = Record(topic, partition, len(logs[partition]), key, value, int(time.time() * 1000))
            logs[partition].append(record)
            return record

    def restart(self) -> None:
        """Lose every log, as the embedded broker does when it restarts."""
        with self._lock:
            self._logs.clear()
            self.incarnation += 1

    def topic_ids(self, topics: list[str]) -> dict[str, str]:
        return {topic: f"memory-{self.incarnation}" for topic in topics}

    def topics(self) -> list[str]:
        with self._lock:
            return sorted(self._logs)

    def end_offset(self, topic: str, partition: int) -> int:
        with self._lock:
            return len(self._topic(topic)[partition])

    def read(self, topic: str, partition: int, offset: int, limit: int) -> list[Record]:
        with self._lock:
            return self._topic(topic)[partition][offset:offset + limit]


class MemoryTransport:
    """Sends to a :class:`MemoryBus`; acknowledges synchronously."""

    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self.last_error: str | None = None

    def connect(self) -> bool:
        return self.bus.available

    def send(self, topic: str, key: bytes, value: bytes, *, done: Done) -> None:
        try:
            self.bus.append(topic, key, value)
        except ConnectionError as exc:
            done(exc)
            return
        done(None)

    def flush(self, timeout_s: float) -> None:
        pass

    def close(self) -> None:
        pass

    def incarnation(self) -> str | None:
        return f"memory-{self.bus.incarnation}" if self.bus.available else None


class MemorySource:
    """Reads a :class:`MemoryBus` the same way, for unit tests."""

    def __init__(self, bus: MemoryBus, topics: list[str]) -> None:
        self._bus = bus
        self._topics = topics
        self._next: dict[Position, int] = {}

    def open(self, offsets: Mapping[Position, int]) -> None:
        self._next = {
            (topic, p): offsets.get((topic, p), 0) for topic in self._topics for p in range(self._bus.partitions)
        }

    def poll(self, timeout_s: float, max_records: int) -> list[Record]:
        records: list[Record] = []
        for (topic, partition), offset in self._next.items():
            room = max_records - len(records)
            if room <= 0:
                break
            got = self._bus.read(topic, partition, offset, room)
            records += got
            self._next[(topic, partition)] = offset + len(got)
        return records

    def end_offsets(self) -> dict[Position, int]:
        return {pos: self._bus.end_offset(*pos) for pos in self._next}

    def positions(self) -> dict[Position, int]:
        return dict(self._next)

    def incarnation(self) -> dict[str, str]:
        return self._bus.topic_ids(self._topics)

    def close(self) -> None:
        pass
