"""A real Kafka-protocol broker (the embedded Tansu) for the integration tier.

One broker per session on a free port; every test gets its own topic prefix, DuckDB file and
state directory, so tests never see each other's data.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rankstream.config import config_env, load_config
from rankstream.deploy.broker import start_broker, stop_broker


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def broker_port(tmp_path_factory):
    config = load_config({"broker_port": free_port(), "state_dir": tmp_path_factory.mktemp("broker")}, env={})
    start_broker(config)
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


def cli(config, *args, timeout=120, check=True, **kwargs) -> subprocess.CompletedProcess:
    """Run the real ``rankstream`` command with ``config`` passed through the environment."""
    env = {**os.environ, **config_env(config)}
    result = subprocess.run([sys.executable, "-m", "rankstream", *args], env=env, capture_output=True, text=True,
                            timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"rankstream {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The embedded broker plus a background materializer (with its hang watch), as `rankstream up`."""
    from rankstream.deploy.services import down, up

    root = tmp_path_factory.mktemp("live")
    config = load_config({"db_path": root / "live.duckdb", "state_dir": root / "state", "broker_port": free_port(),
                          "partitions": 2}, env={})
    up(config)
    yield config
    down(config)


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """Prefect's test harness (a temporary API and database), once per session."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness():
        yield
