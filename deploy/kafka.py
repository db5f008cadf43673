"""Kafka plumbing shared by producers and consumers: client options and topic creation.

kafka-python errors are translated here into :class:`~rankstream.errors.BrokerUnavailable`, so
callers handle one transient error type.
"""

from __future__ import annotations

from typing import Any

from rankstream.config import Config
from rankstream.errors import BrokerUnavailable
from rankstream.schemas.topics import all_topics

__all__ = ["client_options", "describe", "ensure_topics", "existing_topics"]


def describe(exc: BaseException) -> str:
    """An exception as one short line; kafka-python's often have an empty message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def client_options(config: Config) -> dict[str, Any]:
    """Connection and security keyword arguments for any kafka-python client."""
    return {"bootstrap_servers": config.bootstrap_servers.split(","), **config.kafka.client_options()}


def _admin(config: Config, timeout_s: float):
    from kafka.admin import KafkaAdminClient

    try:
        return KafkaAdminClient(**client_options(config), request_timeout_ms=int(timeout_s * 1000),
                                bootstrap_timeout_ms=int(timeout_s * 1000))
    except Exception as exc:  # kafka-python raises NoBrokersAvailable, KafkaTimeoutError, OSError...
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
    """Create rankstream's topics with ``config.partitions`` partitions if missing; returns their names."""
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    wanted = all_topics(config.topic_prefix)
    admin = _admin(config, timeout_s)
    try:
        missing = [t for t in wanted if t not in set(admin.list_topics())]
        for topic in missing:
            try:
                admin.create_topics([NewTopic(topic, num_partitions=config.partitions, replication_factor=1)])
            except TopicAlreadyExistsError:
                pass  # another process created it first
    except BrokerUnavailable:
        raise
    except Exception as exc:
        raise BrokerUnavailable(f"cannot create topics on {config.bootstrap_servers}: {describe(exc)}") from exc
    finally:
        admin.close()
    return wanted
