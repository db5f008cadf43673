"""Sources: where the materializer reads records from, by explicit partition and offset.

No consumer group is used (groups on the embedded broker are slow to join and can jam): the
materializer assigns every partition of its topics itself and seeks to the offsets it stored in
DuckDB. A source also reports end offsets so ``status`` can show lag, and the topic ids that
name the broker's incarnation (a broker that lost its log has new ones; see ``producers.kafka_client``).
"""

from __future__ import annotations

from typing import Mapping, Protocol

from kafka import KafkaConsumer, TopicPartition

from rankstream.producers.kafka_client import TopicIds, client_options, close_quietly, describe
from rankstream.schemas.config import Config
from rankstream.schemas.errors import BrokerUnavailable
from rankstream.schemas.topics import Record

__all__ = ["Record", "Source", "KafkaSource", "Position"]

Position = tuple[str, int]

#: How long the broker may hold a fetch that finds nothing new. Tansu does not answer a held fetch
#: early when data arrives, so this bounds the freshness an idle materializer adds; at 50 ms an
#: idle materializer and broker spent a sixth of a core asking (docs/benchmarks.md).
FETCH_WAIT_MS = 200


class Source(Protocol):
    def open(self, offsets: Mapping[Position, int]) -> None: ...
    def poll(self, timeout_s: float, max_records: int) -> list[Record]: ...
    def end_offsets(self) -> dict[Position, int]: ...
    def positions(self) -> dict[Position, int]: ...
    def incarnation(self) -> dict[str, str]: ...
    def close(self) -> None: ...


class KafkaSource:
    """kafka-python consumer with ``assign()`` + ``seek()`` over all partitions of ``topics``."""

    def __init__(self, config: Config, topics: list[str]) -> None:
        self._config = config
        self._topics = topics
        self._consumer = None
        self._partitions: list = []
        self._topic_ids = None

    def open(self, offsets: Mapping[Position, int]) -> None:
        self.close()
        try:
            consumer = KafkaConsumer(
                **client_options(self._config),
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                fetch_max_bytes=32 << 20,
                max_partition_fetch_bytes=8 << 20,
                fetch_max_wait_ms=FETCH_WAIT_MS,
                bootstrap_timeout_ms=3000,
                request_timeout_ms=10000,
            )
        except Exception as exc:
            raise BrokerUnavailable(f"Kafka at {self._config.bootstrap_servers} did not answer: {describe(exc)}") from exc
        partitions = []
        for topic in self._topics:
            numbers = consumer.partitions_for_topic(topic)
            if not numbers:
                consumer.close()
                raise BrokerUnavailable(f"topic {topic!r} does not exist on {self._config.bootstrap_servers}")
            partitions += [TopicPartition(topic, n) for n in sorted(numbers)]
        consumer.assign(partitions)
        for tp in partitions:
            stored = offsets.get((tp.topic, tp.partition))
            if stored is None:
                consumer.seek_to_beginning(tp)
            else:
                # Where the last read stopped, even past the end offset the broker reports: Tansu
                # reports one less than the next offset after some writes, and a broker that lost
                # its log is told by its new topic ids (the materializer checks), never by offsets.
                consumer.seek(tp, stored)
        self._consumer = consumer
        self._partitions = partitions

    def poll(self, timeout_s: float, max_records: int) -> list[Record]:
        try:
            batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except Exception as exc:
            raise BrokerUnavailable(f"reading from {self._config.bootstrap_servers} failed: {describe(exc)}") from exc
        return [
            Record(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp)
            for messages in batches.values()
            for m in messages
        ]

    def end_offsets(self) -> dict[Position, int]:
        try:
            ends = self._consumer.end_offsets(self._partitions)
        except Exception as exc:
            raise BrokerUnavailable(f"cannot read end offsets: {describe(exc)}") from exc
        return {(tp.topic, tp.partition): offset for tp, offset in ends.items()}

    def positions(self) -> dict[Position, int]:
        return {(tp.topic, tp.partition): self._consumer.position(tp) for tp in self._partitions}

    def incarnation(self) -> dict[str, str]:
        if self._topic_ids is None:
            self._topic_ids = TopicIds(self._config, self._topics)
        return self._topic_ids.read()

    def close(self) -> None:
        if self._topic_ids is not None:
            self._topic_ids.close()
            self._topic_ids = None
        if self._consumer is not None:
            close_quietly(self._consumer, autocommit=False)  # a broken consumer is replaced either way
            self._consumer = None
