"""Requests to running ranks over the bus, with no daemon: ``rankstream profile`` asks named ranks
of a run for a profiler window.

A request is a small JSON object on ``<prefix>.requests``, a topic the materializer does not read
(it is no event). Each rank that started a session reads that topic from its end on a daemon
thread (one fetch a second, so the training thread never waits on it) and hands the requests for
its run and rank to the session.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any, Callable

from rankstream.producers.kafka_client import client_options
from rankstream.schemas.config import Config
from rankstream.schemas.topics import requests_topic

__all__ = ["RequestListener", "profile_request", "decode_request"]

#: How long a poll waits for a request; also how soon a stopped listener ends.
POLL_S = 1.0
#: After the broker could not be reached, the next attempt comes this much later.
RETRY_S = 5.0


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
    """Reads the requests topic from its end; calls ``on_request(request)`` for this rank's."""

    def __init__(self, config: Config, run_id: str, *, rank: int, on_request: Callable[[dict], None]) -> None:
        self._config, self._run_id, self._rank, self._on_request = config, run_id, rank, on_request
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rankstream-requests", daemon=True)
        #: Set once the listener reads from the end of the topic: requests sent after it count.
        self.listening = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception:  # the broker is away: requests wait on the topic, we come back later
                self._stop.wait(RETRY_S)

    def _listen(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        topic = requests_topic(self._config.topic_prefix)
        consumer = KafkaConsumer(**client_options(self._config), group_id=None, enable_auto_commit=False,
                                 request_timeout_ms=10000)
        try:
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                raise LookupError(f"no topic {topic} yet")
            consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
            consumer.seek_to_end()
            for partition in consumer.assignment():
                consumer.position(partition)  # resolve the end now: later requests are the ones we see
            self.listening.set()
            while not self._stop.is_set():
                for records in consumer.poll(timeout_ms=int(POLL_S * 1000)).values():
                    for record in records:
                        request = decode_request(record.value)
                        if request and request["run_id"] == self._run_id and (
                                request["ranks"] is None or self._rank in request["ranks"]):
                            self._on_request(request)
        finally:
            consumer.close()
