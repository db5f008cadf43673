"""Following a small topic from its end on a daemon thread: how producers hear from the rest of
rankstream with no daemon of their own (``rankstream profile``'s requests, the materializer's
announcements of what it stored). The training thread never waits on it.
"""

from __future__ import annotations

import threading

from rankstream.producers.kafka_client import client_options
from rankstream.schemas.config import Config

__all__ = ["TopicTail"]

#: After the broker could not be reached, the next attempt comes this much later.
RETRY_S = 5.0


class TopicTail:
    """Reads ``topic`` from its end (as of when it first connects) and hands every message after
    that to :meth:`received`, which a subclass defines; reconnects after a failure."""

    def __init__(self, config: Config, topic: str, *, name: str, poll_s: float = 1.0) -> None:
        """A message waits at most ``poll_s`` to be seen; each idle fetch costs the rank's process
        and the broker some CPU, so tails that can wait a second or two do (docs/benchmarks.md)."""
        self._config, self._topic, self._poll_s = config, topic, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        #: Set once the tail reads from the end of the topic: messages sent after it count.
        self.listening = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def received(self, raw: bytes | None) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow()
            except Exception:  # the broker is away: messages wait on the topic, we come back later
                self._stop.wait(RETRY_S)

    def _follow(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(**client_options(self._config), group_id=None, enable_auto_commit=False,
                                 request_timeout_ms=10000, fetch_max_wait_ms=int(self._poll_s * 500))
        try:
            partitions = consumer.partitions_for_topic(self._topic)
            if not partitions:
                raise LookupError(f"no topic {self._topic} yet")
            consumer.assign([TopicPartition(self._topic, p) for p in sorted(partitions)])
            consumer.seek_to_end()
            for partition in consumer.assignment():
                consumer.position(partition)  # resolve the end now: later messages are the ones we see
            self.listening.set()
            while not self._stop.is_set():
                for records in consumer.poll(timeout_ms=int(self._poll_s * 1000)).values():
                    for record in records:
                        self.received(record.value)
        finally:
            consumer.close()
