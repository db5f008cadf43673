"""No silent loss with no broker: the producer says where its events wait, and a later
``rankstream up`` (real broker, real materializer, a DuckDB file) delivers and then removes them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

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


EXITS_WITHOUT_SHUTDOWN = """
import time
import rankstream
rankstream.init(run_id="exits", rank=0, world_size=1)
time.sleep(2)  # connected: the Kafka client's exit hook is registered after the session's
for i in range(3000):
    rankstream.instant("tick", i=i)
"""


def test_a_job_that_just_exits_sends_its_last_events_instead_of_spooling_them(live):
    """The session's exit hook drains into the Kafka client; kafka-python's own exit hook, which
    runs first, must not have closed the client by then."""
    from rankstream.consumers.query import connect
    from rankstream.schemas.settings import with_overrides

    holding = with_overrides(live, **{"producer.flush_interval_s": 30.0})  # the ticks are still queued at exit
    done = subprocess.run([sys.executable, "-c", EXITS_WITHOUT_SHUTDOWN], env={**os.environ, **config_env(holding)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "spool" not in done.stderr, done.stderr
    assert not list(live.spool_dir.glob("exits/rank*/*.seg"))
    database, count = connect(live.db_path, wait_s=5.0), 0
    for _ in range(80):
        count = database.fetchall("SELECT count(*) FROM trace_events WHERE run_id = 'exits' AND name = 'tick'")[0][0]
        if count == 3000:
            break
        time.sleep(0.25)
    assert count == 3000
