"""The integration tier: the real ``rankstream`` command, a live stack, Prefect's test harness.

The session's broker (the embedded Tansu on a free port) and ``kafka_config`` live in
``tests/conftest.py``, shared with the reliability suite; every test gets its own topic prefix,
DuckDB file and state directory, so tests never see each other's data.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rankstream.schemas.settings import config_env, load_config
from ..conftest import broker_port, free_port, kafka_config  # noqa: F401  (shared with tests/reliability)


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
    from rankstream.services import down, up

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
