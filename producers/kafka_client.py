"""Kafka plumbing shared by producers and consumers: client options and topic creation.

kafka-python errors are translated here into :class:`~rankstream.schemas.errors.BrokerUnavailable`, so
callers handle one transient error type.

Broker incarnations: a broker that loses its log (the embedded one keeps it in memory) comes back
with no topics; whoever connects first recreates them, and every recreated topic gets a new topic
id (KIP-516). Producers and the materializer compare topic ids to notice that they talk to a new
incarnation, whose offsets restarted at 0 and which holds none of what was acknowledged before.
"""

from __future__ import annotations

import socket
from typing import Any

from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError
from kafka.net.compat import KafkaNetClient

from rankstream.schemas.config import Config
from rankstream.schemas.errors import BrokerUnavailable
from rankstream.schemas.topics import all_topics, requests_topic, stored_topic

__all__ = ["client_options", "close_quietly", "describe", "ensure_topics", "existing_topics", "TopicIds", "unreachable"]

#: Kafka's port when a bootstrap server names none.
_DEFAULT_PORT = 9092


def close_quietly(client: Any, **options: Any) -> str | None:
    """Close a Kafka client that may already be broken; the error as one line, or None. A client
    being discarded cannot be helped by its caller, which records the line if it keeps a status."""
    try:
        client.close(**options)
    except Exception as exc:  # returned, not raised: see the docstring
        return describe(exc)
    return None


def describe(exc: BaseException) -> str:
    """An exception as one short line; kafka-python's often have an empty message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def client_options(config: Config) -> dict[str, Any]:
    """Connection and security keyword arguments for any kafka-python client."""
    return {"bootstrap_servers": config.bootstrap_servers.split(","), **config.kafka.client_options()}


def unreachable(config: Config, timeout_s: float = 0.5) -> str | None:
    """Why no bootstrap server accepts a TCP connection, or None when one does.

    A refused connection is known in microseconds, while a Kafka client's bootstrap retries for
    its whole timeout. During an outage the producer's sender tried that every second, and the
    Python work of each attempt held the GIL long enough to stall training steps by tens of ms.
    Reaching a port proves little (TLS or SASL may still fail): callers go on to connect for real."""
    reason = "no bootstrap server"
    for server in config.bootstrap_servers.split(","):
        host, colon, port = server.strip().rpartition(":")
        if not colon:
            host, port = port, str(_DEFAULT_PORT)
        try:
            with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=timeout_s):
                return None
        except (OSError, ValueError) as exc:
            reason = describe(exc)
    return f"Kafka at {config.bootstrap_servers} did not answer: {reason}"


def _admin(config: Config, timeout_s: float):
    """An admin client, or :class:`BrokerUnavailable`.

    kafka-python starts the client's I/O thread before it bootstraps, and a bootstrap that fails
    leaves that thread running for good, retrying the broker (a producer checking the broker's
    incarnation through an outage left one per attempt). So the client is built here, where it
    can be closed when the admin's constructor raises."""
    built: list[KafkaNetClient] = []

    def client(**configs) -> KafkaNetClient:
        built.append(KafkaNetClient(**configs))
        return built[-1]

    try:
        return KafkaAdminClient(**client_options(config), request_timeout_ms=int(timeout_s * 1000),
                                bootstrap_timeout_ms=int(timeout_s * 1000), kafka_client=client)
    except Exception as exc:  # kafka-python raises NoBrokersAvailable, KafkaTimeoutError, OSError...
        for leftover in built:
            leftover.close()  # stops its I/O thread
        raise BrokerUnavailable(f"Kafka at {config.bootstrap_servers} did not answer: {describe(exc)}") from exc


def existing_topics(config: Config, timeout_s: float = 5.0) -> set[str]:
    admin = _admin(config, timeout_s)
    try:
        return set(admin.list_topics())
    except Exception as exc:
        raise BrokerUnavailable(f"cannot list topics on {config.bootstrap_servers}: {describe(exc)}") from exc
    finally:
        admin.close()


def ensure_topics(config: Config, timeout_s: float = 5.0) -> list[str]:
    """Create rankstream's topics with ``config.partitions`` partitions if missing (the requests
    and stored topics with one); returns the event topics' names."""
    wanted = all_topics(config.topic_prefix)
    partitions = {**{topic: config.partitions for topic in wanted}, requests_topic(config.topic_prefix): 1,
                  stored_topic(config.topic_prefix): 1}
    admin = _admin(config, timeout_s)
    try:
        missing = [t for t in partitions if t not in set(admin.list_topics())]
        for topic in missing:
            try:
                admin.create_topics([NewTopic(topic, num_partitions=partitions[topic], replication_factor=1)])
            except TopicAlreadyExistsError:
                pass  # another process created it first
    except BrokerUnavailable:
        raise
    except Exception as exc:
        raise BrokerUnavailable(f"cannot create topics on {config.bootstrap_servers}: {describe(exc)}") from exc
    finally:
        admin.close()
    return wanted


_NO_ID = "00000000-0000-0000-0000-000000000000"


class TopicIds:
    """Reads the ids of rankstream's topics over one long-lived admin connection.

    ``read()`` returns ``{topic: id}``, raising :class:`BrokerUnavailable` when the broker does not
    answer or a topic is missing (it is about to be recreated). A broker too old for topic ids
    gives ``{}``; callers then fall back to comparing offsets.
    """

    def __init__(self, config: Config, topics: list[str]) -> None:
        self._config = config
        self._topics = topics
        self._admin = None

    def read(self) -> dict[str, str]:
        if self._admin is None:
            self._admin = _admin(self._config, timeout_s=2.0)
        try:
            described = self._admin.describe_topics(self._topics)
        except Exception as exc:
            self.close()
            raise BrokerUnavailable(f"cannot describe topics on {self._config.bootstrap_servers}: "
                                    f"{describe(exc)}") from exc
        ids = {}
        for topic in described:
            if topic.get("error_code"):
                raise BrokerUnavailable(f"topic {topic.get('name')!r} is missing on {self._config.bootstrap_servers}")
            if topic.get("topic_id") and str(topic["topic_id"]) != _NO_ID:
                ids[topic["name"]] = str(topic["topic_id"])
        return ids

    def close(self) -> None:
        if self._admin is not None:
            close_quietly(self._admin)
            self._admin = None
