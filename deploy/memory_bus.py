"""An in-process stand-in for a Kafka cluster, for unit tests that must not need a broker.

It keeps Kafka's contract where rankstream relies on it: per-partition ordered logs with offsets,
the key hashed to a partition, and readers that seek to an offset. It is not durable and not
shared between processes; integration tests use the real broker.
"""

from __future__ import annotations

import threading
import time
import zlib

from rankstream.schemas.topics import Record

__all__ = ["MemoryBus"]


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
