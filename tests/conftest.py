"""Fixtures shared by every test tier: isolated configurations, an in-memory bus, and the session's
real broker (the embedded Tansu on a free port, started only when a test asks for it)."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

from rankstream.schemas.config import Config
from rankstream.schemas.settings import load_config
from rankstream.deploy.broker import stop_broker
from rankstream.services import start_embedded_broker
from tests.doubles import MemoryBus


@pytest.fixture
def make_config(tmp_path: Path):
    """A factory for configurations rooted in this test's tmp dir, ignoring the caller's environment."""

    def factory(**overrides) -> Config:
        base = {
            "db_path": tmp_path / "rankstream.duckdb",
            "state_dir": tmp_path / "state",
            "topic_prefix": f"t{uuid.uuid4().hex[:10]}",
        }
        base.update(overrides)
        return load_config(base, env={})

    return factory


@pytest.fixture
def bus() -> MemoryBus:
    return MemoryBus(partitions=4)


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="reliability suite: more fuzzed messages and fault rounds (slow)")


@pytest.fixture
def long_mode(request) -> bool:
    return bool(request.config.getoption("--long"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def broker_port(tmp_path_factory):
    config = load_config({"broker_port": free_port(), "state_dir": tmp_path_factory.mktemp("broker")}, env={})
    start_embedded_broker(config)
    yield config.broker_port
    stop_broker(config)


@pytest.fixture
def kafka_config(tmp_path: Path, broker_port: int):
    """A factory of configurations on the session broker, with this test's own topics."""
    prefix = f"it{uuid.uuid4().hex[:10]}"

    def factory(**overrides):
        base = {"db_path": tmp_path / "rankstream.duckdb", "state_dir": tmp_path / "state",
                "topic_prefix": prefix, "broker_port": broker_port, "partitions": 4}
        base.update(overrides)
        return load_config(base, env={})

    return factory
