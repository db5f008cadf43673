"""The read-only classification, by DuckDB's parser, and the lockdown of an instance."""

from __future__ import annotations

import socket
import threading
import time

import duckdb
import pytest

from rankstream.consumers.sql_guard import check_read_only, interrupted_when, open_read_only

READS = ["SELECT 1", "FROM t", "WITH x AS (SELECT 1) SELECT * FROM x", "SUMMARIZE t", "DESCRIBE t", "SHOW TABLES",
         "EXPLAIN SELECT * FROM t", "EXPLAIN ANALYZE SELECT * FROM t", "EXPLAIN (FORMAT json) SELECT 1",
         "-- why\nexplain analyse SELECT 1", "SELECT 1; SELECT 2"]
WRITES = ["DELETE FROM t", "EXPLAIN ANALYZE DELETE FROM t", "explain analyze update t set a = 1",
          "EXPLAIN (ANALYZE, FORMAT json) INSERT INTO t VALUES (1)", "/* c */ EXPLAIN ANALYZE CREATE TABLE y AS SELECT 1",
          "EXPLAIN ANALYZE COPY t TO 'x.csv'", "EXPLAIN", "SELECT 1; DROP TABLE t", "SET threads = 1", "PRAGMA version",
          "ATTACH 'other.db'", "INSTALL httpfs", "CALL checkpoint()", "COPY t TO 'x.csv'", ""]


@pytest.fixture
def database(tmp_path):
    path = tmp_path / "t.duckdb"
    with duckdb.connect(str(path)) as connection:
        connection.execute("CREATE TABLE t AS SELECT range AS a FROM range(5)")
    return path


@pytest.mark.parametrize("sql", READS)
def test_reads_pass(database, sql):
    with duckdb.connect(str(database), read_only=True) as connection:
        check_read_only(connection, sql)


@pytest.mark.parametrize("sql", WRITES)
def test_everything_else_is_refused(database, sql):
    with duckdb.connect(str(database), read_only=True) as connection:
        with pytest.raises((PermissionError, duckdb.ParserException)):
            check_read_only(connection, sql)


def test_a_read_only_instance_cannot_reach_the_host_or_unlock_itself(database, tmp_path):
    connection = open_read_only(database)
    try:
        assert connection.execute("SELECT sum(a) FROM t").fetchall() == [(10,)]
        for sql in ("SELECT * FROM read_text('/etc/hostname')", f"COPY t TO '{tmp_path}/x.csv'",
                    "SET enable_external_access = true", "DETACH data", f"ATTACH '{tmp_path}/o.db'"):
            with pytest.raises(duckdb.Error):
                connection.execute(sql)
        assert not (tmp_path / "x.csv").exists() and not (tmp_path / "o.db").exists()
    finally:
        connection.close()


def test_a_long_query_stops_at_its_timeout_or_when_its_client_hangs_up(database):
    connection = open_read_only(database)
    endless = "SELECT count(*) FROM range(100000000000)"
    try:
        started = time.monotonic()
        with pytest.raises(duckdb.InterruptException):
            with interrupted_when(connection, timeout_s=0.5) as stopped:
                connection.execute(endless).fetchall()
        assert "timeout" in stopped["reason"] and time.monotonic() - started < 5
        ours, theirs = socket.socketpair()
        threading.Timer(0.3, theirs.close).start()
        with pytest.raises(duckdb.InterruptException):
            with interrupted_when(connection, timeout_s=None, client=ours) as stopped:
                connection.execute(endless).fetchall()
        assert stopped["reason"] == "its client went away"
        ours.close()
        live, peer = socket.socketpair()
        with interrupted_when(connection, timeout_s=5, client=live) as stopped:  # a client still there
            time.sleep(0.5)
            assert connection.execute("SELECT 42").fetchall() == [(42,)]
        assert stopped["reason"] is None
        live.close(), peer.close()
    finally:
        connection.close()
