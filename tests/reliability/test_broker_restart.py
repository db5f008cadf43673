"""The embedded broker SIGKILLed mid-run and started again on its port, on the real broker (Tansu).

It keeps its log in memory, so the restart loses every message it held, including a backlog the
materializer had not read yet (it is paused across the restart). The producers resend their
window, the materializer notices the new topic ids and rereads from offset 0, and the run ends
with every emitted event in DuckDB exactly once.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import duckdb
import pytest

from rankstream.schemas.settings import config_env, load_config
from rankstream.deploy.broker import broker_status, stop_broker
from rankstream.services import start_embedded_broker
from rankstream.producers.producer import Producer
from rankstream.consumers.materializer import materializer_lag, status_path
from rankstream.demo.synthetic import SyntheticJob, run_synthetic_rank

from ..conftest import free_port

pytestmark = pytest.mark.integration


def read_stored(db_path):
    """(events, distinct batch keys, batch rows) or None while the materializer holds the file."""
    try:
        con = duckdb.connect(str(db_path), read_only=True)
    except duckdb.Error:
        return None
    try:
        return con.execute(
            "SELECT (SELECT count(*) FROM trace_events), "
            "(SELECT count(DISTINCT (run_id, rank, stream, session_id, seq)) FROM ingested_batches), "
            "(SELECT count(*) FROM ingested_batches)").fetchall()[0]
    except duckdb.Error:
        return None
    finally:
        con.close()


def test_a_broker_restart_mid_run_loses_and_repeats_nothing(tmp_path):
    config = load_config({"db_path": tmp_path / "rs.duckdb", "state_dir": tmp_path / "state",
                          "broker_port": free_port(), "partitions": 4, "producer.broker_check_s": 0.5}, env={})
    start_embedded_broker(config)
    materializer = subprocess.Popen([sys.executable, "-m", "rankstream", "consume", "--no-serve-sql"],
                                    env={**os.environ, **config_env(config)},
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and materializer_lag(config) is None:  # until it reads the bus
        time.sleep(0.2)
    job = SyntheticJob("restarted", world_size=2, steps=200, events_per_step=500)
    emitted = [0] * job.world_size
    stats = [None] * job.world_size

    def rank(number: int) -> None:
        producer = Producer(run_id=job.run_id, rank=number, world_size=job.world_size, config=config)
        emitted[number] = run_synthetic_rank(job, number, producer, pace_s=0.05)
        stats[number] = producer.close(timeout_s=30)

    try:
        ranks = [threading.Thread(target=rank, args=(n,)) for n in range(job.world_size)]
        for thread in ranks:
            thread.start()
        time.sleep(2.0)
        materializer.send_signal(signal.SIGSTOP)  # what arrives now is acknowledged but unconsumed
        time.sleep(1.0)
        os.kill(broker_status(config).pid, signal.SIGKILL)
        time.sleep(1.0)
        start_embedded_broker(config)
        materializer.send_signal(signal.SIGCONT)
        for thread in ranks:
            thread.join(120)
        total = sum(emitted)
        # the materializer holds the file while it runs: stop it once it has had time to catch up
        deadline, status = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            time.sleep(2.0)
            status = json.loads(status_path(config).read_text())
            if status["events"] >= total and status.get("lag_messages") == 0:
                break
        materializer.send_signal(signal.SIGTERM)
        output = materializer.communicate(timeout=30)[0]
        stored, distinct_keys, key_rows = read_stored(config.db_path)
        assert stored == total > 0, output
        assert distinct_keys == key_rows
        assert status.get("broker_resets", 0) >= 1, output
        assert "broker restarted without its log" in output
        assert all(s.broker_resets >= 1 and s.events_not_resent == 0 for s in stats), stats
        assert all(s.events_sent == e for s, e in zip(stats, emitted)), (stats, emitted)
    finally:
        if materializer.poll() is None:
            materializer.kill()
        stop_broker(config)
