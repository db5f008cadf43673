"""Fixtures shared by every test tier: isolated configurations and an in-memory bus."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rankstream.config import Config, load_config
from rankstream.deploy.memory_bus import MemoryBus


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
