"""Producers -> real broker over TCP -> materializer -> DuckDB file."""

import os
import random
import signal
import subprocess
import sys
import threading
import time

import duckdb
import pytest
from kafka import KafkaProducer

from rankstream.schemas.settings import config_env
from rankstream.services import materialize
from rankstream.consumers.query import connect
from rankstream.consumers.query_server import server_socket
from rankstream.producers.kafka_client import ensure_topics
from rankstream.producers.producer import Producer
from rankstream.schemas import Stream, topic_for
from rankstream.demo.synthetic import SyntheticJob, run_synthetic_rank

from tests.kills import kill_after_start

from .conftest import cli

pytestmark = pytest.mark.integration

TABLES = ("trace_events", "fr_entries", "process_groups", "heartbeats", "rank_metadata", "rejects")


def produce(config, ranks=2, steps=4, events_per_step=500, run_id="job"):
    job = SyntheticJob(run_id, ranks, steps, events_per_step)
    emitted = 0
    for rank in range(ranks):
        # the materializer runs only afterwards: nothing would announce these as stored
        producer = Producer(run_id=run_id, rank=rank, world_size=ranks, config=config, confirm_stored=False)
        emitted += run_synthetic_rank(job, rank, producer)
        stats = producer.close()
        assert stats.events_dropped == 0 and stats.spool_bytes == 0, stats
    return emitted


def consume_once(config, **kwargs):
    return materialize(config, threading.Event(), once=True, log=lambda line: None, **kwargs)


def count(config, table="trace_events"):
    con = duckdb.connect(str(config.db_path), read_only=True)
    try:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        con.close()


def snapshot(config):
    con = duckdb.connect(str(config.db_path), read_only=True)
    try:
        return {t: sorted(map(repr, con.execute(f"SELECT * FROM {t}").fetchall())) for t in TABLES}
    finally:
        con.close()


def test_events_from_several_ranks_reach_duckdb_exactly(kafka_config):
    config = kafka_config()
    emitted = produce(config, ranks=3)
    status = consume_once(config)
    assert status.events == emitted == count(config)
    assert count(config, "ranks") == 3
    assert count(config, "fr_entries") > 0


def test_a_restarted_materializer_goes_on_where_it_stopped_and_rereads_nothing(kafka_config):
    config = kafka_config()
    produce(config, ranks=2)
    lines: list[str] = []
    first = materialize(config, threading.Event(), once=True, log=lines.append)
    again = materialize(config, threading.Event(), once=True, log=lines.append)
    assert first.messages > 0 and (again.messages, again.duplicates) == (0, 0), lines
    assert not any("restarted" in line or "again" in line for line in lines), lines


def test_replaying_partitions_twice_gives_identical_tables(kafka_config):
    config = kafka_config()
    produce(config)
    consume_once(config)
    first = snapshot(config)
    consume_once(config, rebuild=True)
    assert snapshot(config) == first
    cli(config, "consume", "--once", "--rebuild")
    assert snapshot(config) == first


def test_malformed_messages_land_in_rejects_while_valid_ones_flow(kafka_config):
    config = kafka_config()
    ensure_topics(config)
    raw = KafkaProducer(bootstrap_servers=config.bootstrap_servers)
    topic = topic_for(config.topic_prefix, Stream.TRACE)
    garbage = [b"\xc1", b"\x92\x01", b"{json: no}", b""]
    for value in garbage:
        raw.send(topic, key=b"job/0", value=value)
    raw.flush()
    emitted = produce(config, ranks=1)
    for value in garbage:
        raw.send(topic, key=b"job/1", value=value)
    raw.close()
    consume_once(config)
    assert count(config) == emitted
    con = duckdb.connect(str(config.db_path), read_only=True)
    rows = con.execute("SELECT topic, run_id, rank, reason FROM rejects").fetchall()
    con.close()
    assert len(rows) == 2 * len(garbage)
    assert {r[0] for r in rows} == {topic} and {r[1] for r in rows} == {"job"} and {r[2] for r in rows} == {0, 1}


def _has_table(config, table: str) -> bool:
    con = duckdb.connect(str(config.db_path), read_only=True)
    try:
        return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = $1", [table]).fetchone()[0])
    finally:
        con.close()


def test_materializer_killed_mid_batch_ends_exact_after_restart(kafka_config, tmp_path):
    config = kafka_config(**{"producer.batch_events": 500})
    emitted = produce(config, ranks=4, steps=25, events_per_step=2000)
    env = {**os.environ, **config_env(config)}
    rng = random.Random(7)
    partial_counts = []
    delay_s = 1.0
    # Kills land at a random point after the process has started; a kill that found nothing stored
    # doubles the wait (a slow or busy machine), so some kill lands mid-run on any machine.
    for attempt in range(8):
        # Two messages per transaction keeps the materializer busy for seconds, so each kill
        # lands inside a transaction with work left to do.
        kill_after_start([sys.executable, "-m", "rankstream", "consume", "--no-serve-sql", "--max-messages", "2"],
                         env, tmp_path / f"consume-{attempt}.log", delay_s * (0.5 + rng.random()))
        stored = count(config) if config.db_path.exists() and _has_table(config, "trace_events") else 0
        partial_counts.append(stored)  # a kill before the schema leaves no table
        if 0 < stored < emitted and attempt >= 3:
            break
        delay_s = delay_s * 2 if stored == (partial_counts[-2] if attempt else 0) else delay_s
    print("counts after each kill:", partial_counts, "of", emitted)
    assert any(0 < n < emitted for n in partial_counts), partial_counts
    consume_once(config)
    con = duckdb.connect(str(config.db_path), read_only=True)
    total = con.execute("SELECT count(*) FROM trace_events").fetchone()[0]
    batches, distinct_batches = con.execute(
        "SELECT count(*), count(DISTINCT (run_id, rank, stream, session_id, seq)) FROM ingested_batches").fetchone()
    con.close()
    assert total == emitted
    assert batches == distinct_batches


@pytest.mark.timed
def test_sql_is_live_while_the_materializer_holds_the_file(kafka_config):
    config = kafka_config(materializer_memory_mb=96)
    env = {**os.environ, **config_env(config)}
    process = subprocess.Popen([sys.executable, "-m", "rankstream", "consume"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while server_socket(config.db_path) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        database = connect(config.db_path, wait_s=30)
        assert database.fetchall("SELECT count(*) FROM trace_events") == [(0,)]
        reference = duckdb.connect()
        reference.execute("SET memory_limit = '96MB'")  # the materializer's DuckDB is capped as configured
        assert database.fetchall("SELECT current_setting('memory_limit')") == reference.execute(
            "SELECT current_setting('memory_limit')").fetchall()
        producer = Producer(run_id="live", rank=0, world_size=1, config=config)
        seen_at = None
        emitted_at = time.monotonic()
        producer.emit("visible-soon", ts_ns=time.time_ns())
        producer.flush()
        while time.monotonic() - emitted_at < 5:
            if database.fetchall("SELECT count(*) FROM trace_events WHERE name = 'visible-soon'")[0][0]:
                seen_at = time.monotonic()
                break
            time.sleep(0.05)
        producer.close()
        assert seen_at is not None and seen_at - emitted_at < 5
        result = cli(config, "sql", "--json", "SELECT name FROM trace_events")
        assert '"visible-soon"' in result.stdout
        assert "lock" not in result.stderr.lower()
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "consumed" in stderr
