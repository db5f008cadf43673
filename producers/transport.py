"""Transports: how the producer's background thread hands encoded messages to a bus.

A transport has four calls, all made from the producer's sender thread only:

* ``connect()`` returns True when the bus is reachable (it may block for a couple of seconds);
* ``send(topic, key, value, done=...)`` queues one message and later calls ``done(error_or_None)``;
  it may raise, which the caller treats as a failed send. A permanent error
  (:class:`MessageRefused`) drops the message; any other is retried from the spool;
* ``flush(timeout_s)`` waits for queued messages; ``close()`` releases everything;
* ``incarnation()`` names the broker incarnation (its topic ids), or None when it cannot tell; a
  new name means the broker lost everything it had acknowledged (see ``producers.kafka_client``).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import Callable, Protocol

from kafka import KafkaProducer
from kafka import errors as kafka_errors

from rankstream.producers.kafka_client import (TopicIds, client_options, close_quietly, describe, ensure_topics,
                                              unreachable)
from rankstream.schemas.config import Config
from rankstream.schemas.errors import BrokerUnavailable, MessageRefused, RankstreamError
from rankstream.schemas.topics import all_topics

__all__ = ["Transport", "KafkaTransport", "Done"]

Done = Callable[[BaseException | None], None]


class Transport(Protocol):
    def connect(self) -> bool: ...
    def send(self, topic: str, key: bytes, value: bytes, *, done: Done) -> None: ...
    def flush(self, timeout_s: float) -> None: ...
    def close(self) -> None: ...
    def incarnation(self) -> str | None: ...


def _incarnation_name(topic_ids: dict[str, str]) -> str | None:
    return ",".join(f"{topic}={ids}" for topic, ids in sorted(topic_ids.items())) or None


def _quiet_kafka_logging() -> None:
    """kafka-python logs every failed request at ERROR; during an outage that floods the training
    log. Unless the application configured the ``kafka`` logger itself, only show CRITICAL: the
    producer's own counters and ``last_error`` report the outage instead."""
    kafka_logger = logging.getLogger("kafka")
    if kafka_logger.level == logging.NOTSET:
        kafka_logger.setLevel(logging.CRITICAL)


#: kafka-python's errors about one message itself; any other failure is the broker's or the
#: client's state (down, restarted, a fenced idempotent producer) and passes once a new client
#: reaches a healthy broker.
_REFUSED_MESSAGE = (kafka_errors.MessageSizeTooLargeError, kafka_errors.RecordListTooLargeError,
                    kafka_errors.InvalidRecordError, kafka_errors.CorruptRecordError)


def delivery_error(exc: BaseException) -> RankstreamError:
    """A failed send as :class:`MessageRefused` (permanent: dropped and counted) or
    :class:`BrokerUnavailable` (transient: spooled and resent)."""
    kind = MessageRefused if isinstance(exc, _REFUSED_MESSAGE) else BrokerUnavailable
    return kind(describe(exc))


class KafkaTransport:
    """kafka-python's KafkaProducer, created lazily on the sender thread (construction connects)."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._producer = None
        self._topic_ids = None
        self.last_error: str | None = None
        #: Records handed to the client and not yet acknowledged or failed (see :meth:`flush`).
        self._unfinished = 0
        self._counting = threading.Lock()
        _quiet_kafka_logging()

    def connect(self) -> bool:
        if self._producer is not None:
            return True
        why = unreachable(self._config)
        if why is not None:  # nothing listens: skip the Kafka client's whole bootstrap timeout
            self.last_error = f"BrokerUnavailable: {why}"
            return False
        settings = self._config.producer
        try:
            ensure_topics(self._config, timeout_s=2.0)
            self._producer = KafkaProducer(
                **client_options(self._config),
                compression_type=None if settings.compression == "none" else settings.compression,
                linger_ms=5,
                batch_size=1 << 20,
                max_request_size=24 << 20,
                max_block_ms=200,
                request_timeout_ms=3000,
                delivery_timeout_ms=8000,
                bootstrap_timeout_ms=2000,
                enable_idempotence=True,
                acks="all",
            )
            # kafka-python closes its producer at interpreter exit, before the session's own exit
            # hook (registered earlier, so run later) hands it the last batches: they would all be
            # spooled instead of sent. The session closes it, after draining.
            atexit.unregister(getattr(self._producer, "_cleanup", None) or (lambda: None))
        except Exception as exc:  # unreachable broker, bad credentials, ...
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        self.last_error = None
        return True

    def send(self, topic: str, key: bytes, value: bytes, *, done: Done) -> None:
        if self._producer is None:
            raise BrokerUnavailable("not connected")
        try:
            future = self._producer.send(topic, key=key, value=value)
        except Exception as exc:
            raise delivery_error(exc) from exc
        with self._counting:
            self._unfinished += 1
        future.add_callback(lambda _metadata: self._finished(done, None))
        future.add_errback(lambda exc: self._finished(done, delivery_error(exc)))

    def _finished(self, done: Done, error: RankstreamError | None) -> None:
        with self._counting:
            self._unfinished -= 1
        done(error)

    def flush(self, timeout_s: float) -> None:
        """Wait until every record sent so far is acknowledged or failed, ``timeout_s`` at most in
        all. kafka-python's own flush gives its timeout to each batch in turn: under a saturated
        broker, closes meant to take 120 s took longer and their process exited mid-drain
        (docs/reliability.md). Records linger 5 ms at most, so none needs pushing out."""
        deadline = time.monotonic() + timeout_s
        while self._unfinished and time.monotonic() < deadline:
            time.sleep(0.005)
        if self._unfinished:  # they fail via the errbacks at close, and are spooled
            self.last_error = f"{self._unfinished} records unacknowledged after {timeout_s:.1f} s"

    def incarnation(self) -> str | None:
        if self._topic_ids is None:
            self._topic_ids = TopicIds(self._config, all_topics(self._config.topic_prefix))
        try:
            return _incarnation_name(self._topic_ids.read())
        except BrokerUnavailable:
            return None

    def close(self) -> None:
        if self._topic_ids is not None:
            self._topic_ids.close()
        if self._producer is not None:
            self.last_error = close_quietly(self._producer, timeout=0.5) or self.last_error
            _abandon(self._producer)  # a close that timed out returns with its I/O thread still running
            self._producer = None


def _abandon(producer) -> None:
    """Force-close a KafkaProducer whose graceful close timed out, and wait for its I/O thread.

    kafka-python has no public call for this; without it the producer stays half-open and its
    ``__del__`` prints a traceback at exit. Its ``close(timeout)`` only flags a force close when
    the timeout passes; the I/O thread fails the unacknowledged batches when it next wakes, so the
    join lets their errbacks hand the messages back to ``Delivery`` first (which spools them, and
    spools itself whatever is still unreported after the join).
    """
    sender = getattr(producer, "_sender", None)
    try:
        if sender is not None and sender.is_alive():
            sender.force_close()
            sender.join(2.0)
        producer._closed = True
    except Exception:  # kafka-python's internals changed: the thread is a daemon and dies with the process
        return
