"""No silent loss with no broker: the producer says where its events wait, and a later
``rankstream up`` (real broker, real materializer, a DuckDB file) delivers and then removes them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rankstream.schemas.settings import config_env

from .conftest import cli, free_port

pytestmark = pytest.mark.integration

JOB = """
from rankstream.producers.producer import Producer
producer = Producer(run_id="offline", rank=RANK, world_size=2)
for i in range(5000):
    producer.emit("op", ts_ns=i + 1, step=i // 1000)
producer.close(timeout_s=1.0)
"""


def test_a_job_without_a_broker_says_where_its_events_wait_and_up_delivers_them(make_config):
    config = make_config(broker_port=free_port(), partitions=2)
    env = {**os.environ, **config_env(config)}
    for rank in (0, 1):
        done = subprocess.run([sys.executable, "-c", JOB.replace("RANK", str(rank))], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stderr.count("no broker at") == 1, done.stderr  # once, not per message
        assert f"left in the spool {config.spool_dir}" in done.stderr
    assert list(config.spool_dir.glob("offline/rank*/*.seg"))
    try:
        up = cli(config, "up")
        assert "delivered 10,000 spooled events" in up.stdout, up.stdout + up.stderr
        assert not list(config.spool_dir.glob("offline/rank*/*.seg"))  # stored, so removed
        stored = cli(config, "sql", "SELECT rank, count(*) FROM trace_events WHERE run_id = 'offline' "
                                    "GROUP BY rank ORDER BY rank", "--csv").stdout
        assert stored.split() == ["rank,count_star()", "0,5000", "1,5000"], stored
        assert "nothing spooled" in cli(config, "flush").stdout
    finally:
        cli(config, "down", check=False)
