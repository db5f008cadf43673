"""One Kafka consumer follows every small topic a rank listens to (real broker over TCP)."""

import threading
import time

import pytest
from kafka import KafkaProducer

from rankstream.producers.kafka_client import ensure_topics
from rankstream.producers.topic_tail import TopicTail
from rankstream.schemas.topics import requests_topic, stored_topic

pytestmark = pytest.mark.integration


def _until(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_one_tail_hands_each_topic_its_own_messages_from_when_it_was_followed(kafka_config):
    config = kafka_config()
    ensure_topics(config)
    stored, requests = stored_topic(config.topic_prefix), requests_topic(config.topic_prefix)
    sender = KafkaProducer(bootstrap_servers=config.bootstrap_servers.split(","))
    sender.send(stored, b"before anyone listened").get(10)
    got: dict[str, list[bytes]] = {stored: [], requests: []}
    tail = TopicTail(config, name="test-tail")
    try:
        tail.follow(stored, got[stored].append)
        assert _until(lambda: stored in tail.listening)
        sender.send(stored, b"s1").get(10)
        assert _until(lambda: got[stored] == [b"s1"]), got
        assert [t.name for t in threading.enumerate()].count("test-tail") == 1

        # A topic added while the tail runs: the first topic keeps its place, the new one starts at its end.
        sender.send(requests, b"before the follow").get(10)
        tail.follow(requests, got[requests].append)
        assert _until(lambda: requests in tail.listening)
        sender.send(stored, b"s2").get(10)
        sender.send(requests, b"r1").get(10)
        assert _until(lambda: got[requests] == [b"r1"] and got[stored] == [b"s1", b"s2"]), got
    finally:
        tail.stop()
        sender.close()
    assert got == {stored: [b"s1", b"s2"], requests: [b"r1"]}
