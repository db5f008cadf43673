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


def test_checking_the_broker_while_it_is_down_leaves_no_client_thread_behind(make_config):
    """kafka-python's admin client starts its I/O thread before it bootstraps; a failed bootstrap
    used to leave that thread retrying forever, one per incarnation check during an outage."""
    import threading

    port = free_port()
    transport = KafkaTransport(make_config(**{"kafka.bootstrap_servers": f"127.0.0.1:{port}"}))
    before = {t for t in threading.enumerate() if t.name.startswith("kafka-io")}
    assert transport.incarnation() is None  # the admin client's bootstrap fails after its 2 s
    transport.close()
    assert {t for t in threading.enumerate() if t.name.startswith("kafka-io")} == before


def test_kafka_failures_become_permanent_only_when_the_message_itself_was_refused():
    from kafka import errors as kafka_errors

    from rankstream.producers.transport import delivery_error
    from rankstream.schemas.errors import is_transient

    assert not is_transient(delivery_error(kafka_errors.MessageSizeTooLargeError("1 MB > limit")))
    for passing in (kafka_errors.KafkaTimeoutError(), kafka_errors.OutOfOrderSequenceNumberError(),
                    kafka_errors.UnknownProducerIdError(), kafka_errors.KafkaConnectionError()):
        assert is_transient(delivery_error(passing)), passing


class _HeldFuture:
    """A kafka-python send future the broker answers only when the test says so."""

    def __init__(self) -> None:
        self.callbacks, self.errbacks = [], []

    def add_callback(self, callback) -> None:
        self.callbacks.append(callback)

    def add_errback(self, errback) -> None:
        self.errbacks.append(errback)


class _SlowBroker:
    def __init__(self) -> None:
        self.futures = []

    def send(self, topic, key, value):
        self.futures.append(_HeldFuture())
        return self.futures[-1]


def test_flush_waits_for_every_record_but_never_past_its_timeout_in_all(make_config):
    """kafka-python's own flush gives its timeout to each batch in turn: a saturated broker kept
    producers' closes past their deadline, and the process exited with messages unspooled."""
    transport = KafkaTransport(make_config())
    transport._producer = broker = _SlowBroker()
    outcomes = []
    for index in range(50):
        transport.send("t", b"k", b"v", done=outcomes.append)
    started = time.monotonic()
    transport.flush(0.3)
    assert time.monotonic() - started < 1.0 and outcomes == []
    assert transport.last_error == "50 records unacknowledged after 0.3 s"
    for future in broker.futures[:49]:
        future.callbacks[0](None)
    broker.futures[49].errbacks[0](RuntimeError("refused"))
    started = time.monotonic()
    transport.flush(30.0)
    assert time.monotonic() - started < 1.0 and outcomes[:49] == [None] * 49 and outcomes[49] is not None
    transport._producer = None
