"""Following small topics from their end on one daemon thread: how producers hear from the rest of
rankstream with no daemon of their own (the materializer's announcements of what it stored,
``rankstream profile``'s requests). The training thread never waits on it.

One Kafka consumer serves every topic a process follows, because each consumer costs the rank
CPU even when nothing arrives (kafka-python decodes every fetch in Python), and each fetch waits
up to a second for a batch, so that a topic written many times a second (the announcements) is
read about once a second (docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import threading
from typing import Callable

from rankstream.producers.kafka_client import client_options
from rankstream.schemas.config import Config

__all__ = ["TopicTail"]

#: After the broker could not be reached, the next attempt comes this much later.
RETRY_S = 5.0
#: A fetch returns after this long, or at once when ``_BATCH_BYTES`` are waiting.
MAX_WAIT_S = 1.0
_BATCH_BYTES = 1 << 20


class TopicTail:
    """Reads each followed topic from its end (as of when it is first read) and hands every
    message after that to the topic's handler; reconnects after a failure."""

    def __init__(self, config: Config, *, name: str) -> None:
        self._config = config
        self._handlers: dict[str, Callable[[bytes | None], None]] = {}
        self._changed = threading.Event()  # a topic was added: the consumer's assignment follows
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False
        self._lock = threading.Lock()
        #: The topics read from their ends so far: messages sent to them after they appear here count.
        self.listening: frozenset[str] = frozenset()

    def follow(self, topic: str, handler: Callable[[bytes | None], None]) -> None:
        """From now on, hand ``topic``'s messages to ``handler`` (called on the tail's thread)."""
        with self._lock:
            self._handlers[topic] = handler
            self._changed.set()
            if not self._started:
                self._started = True
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow()
            except Exception:  # the broker is away: messages wait on the topics, we come back later
                self._stop.wait(RETRY_S)

    def _follow(self) -> None:
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(**client_options(self._config), group_id=None, enable_auto_commit=False,
                                 request_timeout_ms=10000, fetch_max_wait_ms=int(MAX_WAIT_S * 1000),
                                 fetch_min_bytes=_BATCH_BYTES)
        try:
            self._changed.set()  # a new consumer starts from the ends
            self.listening = frozenset()
            while not self._stop.is_set():
                if self._changed.is_set():
                    self._assign(consumer)
                for partition, records in consumer.poll(timeout_ms=int(MAX_WAIT_S * 2000)).items():
                    handler = self._handlers[partition.topic]
                    for record in records:
                        handler(record.value)
        finally:
            consumer.close()

    def _assign(self, consumer) -> None:
        """Assign every partition of every followed topic that exists, keeping the positions already
        held and starting the new ones at their ends (resolved now: later messages are the ones we
        see). A topic not created yet is looked for again at the next poll."""
        from kafka import TopicPartition

        self._changed.clear()
        held = {partition: consumer.position(partition) for partition in consumer.assignment()}
        partitions = []
        for topic in sorted(self._handlers):
            numbers = consumer.partitions_for_topic(topic)
            if not numbers:
                self._changed.set()
            partitions += [TopicPartition(topic, number) for number in sorted(numbers or ())]
        if not partitions:
            raise LookupError(f"none of the topics {sorted(self._handlers)} exists yet")
        if set(partitions) != set(held):
            consumer.assign(partitions)
            for partition in partitions:
                if partition in held:
                    consumer.seek(partition, held[partition])
                else:
                    consumer.seek_to_end(partition)
                    consumer.position(partition)
        self.listening = frozenset(partition.topic for partition in partitions)
