"""The materializer killed with SIGKILL at random moments, over and over, on the real broker:
every event emitted ends up in DuckDB exactly once (rows, batch keys and offsets commit together).
12 kills by default, 60 with ``--long``; one of the restarts is a ``--rebuild`` (killed too)."""

import os
import random
import subprocess
import sys

import duckdb
import pytest

from rankstream.schemas.settings import config_env
from rankstream.producers.producer import Producer
from rankstream.demo.synthetic import SyntheticJob, run_synthetic_rank
from tests.kills import kill_after_start

pytestmark = pytest.mark.integration


def _stored(db_path) -> int:
    if not db_path.exists():
        return 0
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM trace_events").fetchall()[0][0]
    except duckdb.CatalogException:
        return 0
    finally:
        con.close()


def test_sigkilled_materializer_loses_and_repeats_nothing(kafka_config, long_mode, tmp_path):
    config = kafka_config()
    job = SyntheticJob("crashy", world_size=4, steps=100, events_per_step=1000)
    emitted = 0
    for rank in range(job.world_size):
        producer = Producer(run_id=job.run_id, rank=rank, world_size=job.world_size, config=config)
        emitted += run_synthetic_rank(job, rank, producer)
        producer.close(timeout_s=30)
    env = {**os.environ, **config_env(config)}
    command = [sys.executable, "-m", "rankstream", "consume", "--no-serve-sql", "--max-messages", "1"]
    rng = random.Random(20261122)
    kills = 60 if long_mode else 12
    progress = []
    for round_number in range(kills):
        extra = ["--rebuild"] if round_number == kills // 2 else []
        # kills land mid-stream: timed from the interpreter's first line, not from its start
        kill_after_start(command + extra, env, tmp_path / f"consume-{round_number}.log", rng.uniform(0.1, 1.7))
        progress.append(_stored(config.db_path))
    # the kills landed while the backlog was being written, not all before or after it
    assert sum(0 < n < emitted for n in progress) >= 3, progress  # a fast machine drains it in a few rounds
    finished = subprocess.run(command + ["--once"], env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    con = duckdb.connect(str(config.db_path), read_only=True)
    stored = con.execute("SELECT count(*) FROM trace_events WHERE run_id = 'crashy'").fetchall()[0][0]
    batches, distinct = con.execute("SELECT count(*), count(DISTINCT (run_id, rank, stream, session_id, seq)) "
                                    "FROM ingested_batches").fetchall()[0]
    fr_rows, fr_distinct = con.execute("SELECT count(*), count(DISTINCT (rank, record_id, snapshot_ns)) "
                                       "FROM fr_entries").fetchall()[0]
    con.close()
    assert stored == emitted
    assert batches == distinct and fr_rows == fr_distinct

