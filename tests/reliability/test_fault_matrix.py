"""Zero loss in every fault order, checked by sequence number, on the real broker (Tansu).

Three faults hit a producer process that emits numbered events (``e0``, ``e1``, ...) while they
happen: the materializer SIGKILLed (and left down), the broker SIGKILLed and started again empty
on its port (it keeps its log in memory), and the producer itself exiting cleanly. Every order of
the three is one scenario, each from fresh state (its own broker, DuckDB file and spool). Then a
materializer is started and ``rankstream flush`` delivers what the producer spooled: every number
it emitted must be stored exactly once, and no spool may be left.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import signal
import subprocess
import sys
import time

import duckdb
import pytest

from rankstream.deploy.broker import broker_status, stop_broker
from rankstream.schemas.settings import config_env, load_config
from rankstream.services import start_embedded_broker

from ..conftest import free_port

pytestmark = pytest.mark.integration

FAULTS = ("materializer_killed", "broker_restarted", "producer_exited")
#: Events between two faults: the producer keeps emitting for this long.
BETWEEN_FAULTS_S = 1.5

PRODUCER = """
import sys, time
from pathlib import Path
from rankstream.producers.producer import Producer
from rankstream.schemas.settings import load_config

stop, report = Path(sys.argv[1]), Path(sys.argv[2])
producer = Producer(run_id="matrix", rank=0, world_size=1, config=load_config())
emitted = 0
while not stop.exists():
    for _ in range(100):
        producer.emit(f"e{emitted}", "matrix", "i", ts_ns=time.time_ns())
        emitted += 1
    time.sleep(0.01)
stats = producer.close(timeout_s=20)
report.write_text(f"{emitted} {stats.events_dropped}")
"""


def _materializer(config) -> subprocess.Popen:
    """A materializer serving SQL, as ``up`` starts it (``flush`` asks it what is stored)."""
    return subprocess.Popen([sys.executable, "-m", "rankstream", "consume"],
                            env={**os.environ, **config_env(config)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _stored_numbers(db_path) -> list[int]:
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        names = con.execute("SELECT name FROM trace_events WHERE run_id = 'matrix'").fetchall()
    finally:
        con.close()
    return sorted(int(name[1:]) for (name,) in names)


def _scenario(root, order) -> str | None:
    """One fault order from fresh state; None when every event arrived once, else what went wrong."""
    root.mkdir()
    config = load_config({"db_path": root / "rs.duckdb", "state_dir": root / "state",
                          "broker_port": free_port(), "partitions": 2, "producer.broker_check_s": 0.5}, env={})
    env = {**os.environ, **config_env(config)}
    start_embedded_broker(config)
    materializer = _materializer(config)
    stop, report = root / "stop", root / "report"
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, str(stop), str(report)], env=env,
                                stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (config.state_dir / "materializer.json").exists(), 60, "the materializer")
        time.sleep(BETWEEN_FAULTS_S)
        for fault in order:
            if fault == "materializer_killed":
                materializer.kill()
                materializer.wait(10)
            elif fault == "broker_restarted":
                os.kill(broker_status(config).pid, signal.SIGKILL)
                time.sleep(0.5)
                start_embedded_broker(config)
            else:
                stop.touch()
                producer.wait(60)
            time.sleep(BETWEEN_FAULTS_S)
        emitted, dropped = map(int, report.read_text().split())
        materializer = _materializer(config)
        flushed = subprocess.run([sys.executable, "-m", "rankstream", "flush"], env=env, capture_output=True,
                                 text=True, timeout=120)
        if flushed.returncode:
            return f"flush failed: {flushed.stderr}"
        _wait_for(lambda: not list((config.state_dir / "spool").rglob("*.seg")), 30, "the spool to empty")
        time.sleep(1.0)  # the materializer stores what flush saw stored; then it lets go of the file
        materializer.terminate()
        materializer.wait(30)
        stored = _stored_numbers(config.db_path)
        missing = sorted(set(range(emitted)) - set(stored))
        repeated = len(stored) - len(set(stored))
        if emitted < 1000 or dropped or missing or repeated:
            return (f"{emitted} emitted, {dropped} dropped, {len(missing)} missing (first {missing[:5]}), "
                    f"{repeated} repeated; flush said {flushed.stdout.strip()!r}")
        return None
    finally:
        for process in (materializer, producer):
            if process.poll() is None:
                process.kill()
        stop_broker(config)


def test_no_fault_order_loses_or_repeats_an_event(tmp_path):
    orders = list(itertools.permutations(FAULTS))
    # Three at a time: each scenario mostly waits between its faults.
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        outcomes = list(pool.map(lambda n: _scenario(tmp_path / f"order{n}", orders[n]), range(len(orders))))
    failures = {" then ".join(order): outcome for order, outcome in zip(orders, outcomes) if outcome}
    assert failures == {}
