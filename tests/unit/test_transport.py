"""The Kafka transport during an outage: cheap to retry, clear about why."""

import time

from rankstream.producers.transport import KafkaTransport
from tests.conftest import free_port


def test_connecting_where_nothing_listens_fails_at_once_and_says_where(make_config):
    port = free_port()  # bound and released: nothing listens there now
    transport = KafkaTransport(make_config(**{"kafka.bootstrap_servers": f"127.0.0.1:{port}"}))
    started = time.monotonic()
    assert transport.connect() is False
    # a Kafka client's bootstrap would retry for its 2 s timeout; the sender retries every second
    assert time.monotonic() - started < 1.0
    assert f"127.0.0.1:{port} did not answer" in transport.last_error
    assert "refused" in transport.last_error.lower()
    transport.close()
