"""Telling producers what is stored: after its commits, the materializer announces, per sender
(``run, rank, stream, session``), the ranges of sequence numbers DuckDB holds (``schemas.stored``).

Producers keep what the broker acknowledged until an announcement covers it. Announcements are
cumulative and every recently active sender is announced again every ``repeat_s``, so a producer
that missed one (it started listening late, the broker restarted) hears it again, and a
materializer that restarted announces what its predecessor stored (read back from
``ingested_batches`` the first time it sees a sender).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import pyarrow as pa

from rankstream.producers.kafka_client import client_options, close_quietly
from rankstream.schemas.config import Config
from rankstream.schemas.stored import Ranges, Sender, StoredRanges, encode_stored, merge_ranges
from rankstream.schemas.topics import stored_topic

__all__ = ["StoredAnnouncer", "KafkaAnnouncements"]


class StoredAnnouncer:
    def __init__(self, publish: Callable[[bytes], None], *, every_s: float = 0.5, repeat_s: float = 2.0,
                 forget_after_s: float = 120.0) -> None:
        self._publish = publish
        self._every_s, self._repeat_s, self._forget_after_s = every_s, repeat_s, forget_after_s
        self._lock = threading.Lock()
        self._ranges: dict[Sender, Ranges] = {}
        self._touched_at: dict[Sender, float] = {}
        self._changed: set[Sender] = set()
        self._published_at = self._repeated_at = 0.0

    def note(self, keys: pa.Table, load: Callable[[list[Sender]], dict[Sender, list[int]]]) -> None:
        """After a commit: add its batch keys. ``load`` reads back what is already stored for
        senders this announcer has not seen (a restarted materializer's predecessor stored them)."""
        if not keys.num_rows:
            return
        columns = keys.select(["run_id", "rank", "stream", "session_id", "seq"]).to_pydict()
        seqs: dict[Sender, list[int]] = {}
        for run_id, rank, stream, session_id, seq in zip(*columns.values()):
            seqs.setdefault((run_id, rank, stream, session_id), []).append(seq)
        with self._lock:
            unseen = [sender for sender in seqs if sender not in self._ranges]
        earlier = load(unseen) if unseen else {}
        now = time.monotonic()
        with self._lock:
            for sender, new in seqs.items():
                self._ranges[sender] = merge_ranges(self._ranges.get(sender, []), [*new, *earlier.get(sender, ())])
                self._touched_at[sender] = now
                self._changed.add(sender)
        self.tick(now)

    def announce_all(self) -> None:
        with self._lock:
            message = encode_stored(StoredRanges(sender, ranges) for sender, ranges in self._ranges.items())
            self._changed.clear()
        if self._ranges:
            self._publish(message)

    def tick(self, now: float | None = None) -> None:
        """Publish what changed (at most every ``every_s``) and repeat the recent senders (every ``repeat_s``)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if now - self._repeated_at >= self._repeat_s:
                self._repeated_at = now
                for sender in [s for s, at in self._touched_at.items() if now - at > self._forget_after_s]:
                    del self._touched_at[sender], self._ranges[sender]
                senders = list(self._ranges)
            elif self._changed and now - self._published_at >= self._every_s:
                senders = list(self._changed)
            else:
                return
            self._published_at = now
            self._changed.clear()
            message = encode_stored(StoredRanges(sender, self._ranges[sender]) for sender in senders)
        if senders:
            self._publish(message)


class KafkaAnnouncements:
    """Publishes announcements on ``<prefix>.stored``, fire and forget: a lost one is repeated."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._producer = None
        #: The committer thread and the main loop both announce: one client, made once.
        self._lock = threading.Lock()

    def __call__(self, message: bytes) -> None:
        from kafka import KafkaProducer

        with self._lock:
            try:
                if self._producer is None:
                    self._producer = KafkaProducer(**client_options(self._config), acks=1, linger_ms=0,
                                                   max_block_ms=2000)
                self._producer.send(stored_topic(self._config.topic_prefix), message)
            except Exception:  # the broker is away: the next repeat announces the same, and more
                self._close()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._producer is not None:
            close_quietly(self._producer, timeout=1)
            self._producer = None
