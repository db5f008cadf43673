"""User SQL cannot write or reach the host, through the materializer (the real one, serving its
DuckDB file) or on a file no materializer holds; a query past its timeout, or whose client went
away, stops."""

from __future__ import annotations

import subprocess
import sys
import time

import duckdb
import psutil
import pytest

from rankstream.schemas.settings import config_env, load_config

from .conftest import cli

pytestmark = pytest.mark.integration

#: Each was run by `rankstream sql` before: deleted rows, wrote files or read the host's.
HOSTILE = [
    "EXPLAIN ANALYZE DELETE FROM trace_events",
    "EXPLAIN ANALYZE UPDATE trace_events SET name = 'x'",
    "EXPLAIN ANALYZE CREATE TABLE stolen AS SELECT 1",
    "EXPLAIN ANALYZE COPY (SELECT 1) TO 'OUT'",
    "/* hidden */ explain (analyze) DELETE FROM trace_events",
    "SELECT * FROM read_text('/etc/hostname')",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM glob('/root/*')",
    "SELECT 1; DELETE FROM trace_events",
    "SET enable_external_access = true",
    "INSTALL httpfs",
]
#: With --write a user may change rows, never reach the host or unlock the instance.
HOSTILE_WRITES = ["COPY (SELECT 1) TO 'OUT'", "SET enable_external_access = true", "SET lock_configuration = false",
                  "SELECT * FROM read_text('/etc/hostname')"]
LONG = "SELECT count(*) FROM range(1000000) a, range(1000000) b"


def _refused(config, tmp_path, statements, *extra):
    for statement in statements:
        out = tmp_path / "stolen.csv"
        done = cli(config, "sql", *extra, statement.replace("OUT", str(out)), check=False)
        assert done.returncode == 2, (statement, done.stdout, done.stderr)
        assert not out.exists(), statement


def _count(config) -> int:
    return int(cli(config, "sql", "--csv", "SELECT count(*) FROM trace_events").stdout.split()[-1])


@pytest.fixture
def stored(live):
    """A few events in the live database."""
    job = ("from rankstream.producers.producer import Producer\n"
           "p = Producer(run_id='guarded', rank=0, world_size=1)\n"
           "[p.emit('op', ts_ns=i + 1) for i in range(100)]\np.close()\n")
    subprocess.run([sys.executable, "-c", job], env={**__import__("os").environ, **config_env(live)}, check=True,
                   timeout=60)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _count(live) < 100:
        time.sleep(0.25)
    return live


def test_through_the_materializer_user_sql_only_reads(stored, tmp_path):
    before = _count(stored)
    _refused(stored, tmp_path, HOSTILE)
    _refused(stored, tmp_path, HOSTILE_WRITES, "--write")
    assert _count(stored) == before
    assert cli(stored, "sql", "--csv", "EXPLAIN ANALYZE SELECT count(*) FROM trace_events").returncode == 0


def test_a_file_no_materializer_holds_is_read_the_same_way(tmp_path):
    db = tmp_path / "alone.duckdb"
    with duckdb.connect(str(db)) as connection:
        connection.execute("CREATE TABLE trace_events AS SELECT range AS ts_ns, 'op' AS name FROM range(10)")
        connection.execute("CREATE VIEW doubled AS SELECT ts_ns * 2 AS t FROM trace_events")
    config = load_config({"db_path": db, "state_dir": tmp_path / "state"}, env={})
    _refused(config, tmp_path, HOSTILE)
    assert cli(config, "sql", "--csv", "SELECT sum(t) FROM doubled").stdout.split()[-1] == "90"
    with duckdb.connect(str(db), read_only=True) as connection:
        assert connection.execute("SELECT count(*) FROM trace_events").fetchall() == [(10,)]


@pytest.mark.timed
def test_a_query_past_its_timeout_stops_with_a_clear_error(stored):
    started = time.monotonic()
    done = cli(stored, "sql", "--timeout", "1", LONG, check=False)
    assert done.returncode == 2 and "timeout" in done.stderr + done.stdout
    assert time.monotonic() - started < 15


@pytest.mark.timed
def test_a_query_whose_client_died_stops_in_the_materializer(stored):
    from rankstream.services import materializer_pid

    materializer = psutil.Process(materializer_pid(stored))
    client = subprocess.Popen([sys.executable, "-m", "rankstream", "sql", "--timeout", "600", LONG],
                              env={**__import__("os").environ, **config_env(stored)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    time.sleep(2)
    busy = materializer.cpu_times()
    time.sleep(1)
    assert sum(materializer.cpu_times()[:2]) - sum(busy[:2]) > 0.5  # the query is running there
    client.kill()
    client.wait()
    time.sleep(1.5)
    quiet = materializer.cpu_times()
    time.sleep(2)
    assert sum(materializer.cpu_times()[:2]) - sum(quiet[:2]) < 0.6  # and stopped with its client
