"""Queries from other processes: through the query server, straight from the file, or a clear wait."""

import contextlib
import subprocess
import sys
import textwrap
import time

import duckdb
import pytest

from rankstream.consumers.query import Database, connect
from rankstream.consumers.query_protocol import sidecar_path
from rankstream.consumers.query_server import QueryServer
from rankstream.consumers.store import Store
from rankstream.schemas.errors import DatabaseBusy, QueryError

HOLD_FILE = textwrap.dedent("""
    import duckdb, sys, time
    con = duckdb.connect(sys.argv[1])
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
""")


@pytest.fixture
def db_path(tmp_path):
    path = tmp_path / "q.duckdb"
    con = duckdb.connect(str(path))
    Store(con)
    con.execute("INSERT INTO rejects (topic, partition, kafka_offset, reason) VALUES ('t', 0, 1, 'why')")
    con.close()
    return path


def test_reads_straight_from_the_file_when_nobody_holds_it(db_path):
    database = connect(db_path)
    assert database.fetchall("SELECT reason FROM rejects") == [("why",)]
    relation = database.sql("SELECT count(*) AS n FROM rejects")
    assert relation.fetchall() == [(1,)]
    duckdb.connect(str(db_path)).close()  # the client holds no lock between calls


def test_calls_inside_held_share_one_connection_and_release_the_file_after(db_path):
    database = connect(db_path, read_only=False)
    with database.held():
        database.execute("CREATE TEMP TABLE scratch AS SELECT 42 AS answer")  # a temp table lives in its connection
        assert database.fetchall("SELECT answer FROM scratch") == [(42,)]
        assert database.fetchall("SELECT reason FROM rejects") == [("why",)]
    with pytest.raises(QueryError, match="scratch"):  # outside the block every call has its own connection
        database.fetchall("SELECT answer FROM scratch")
    duckdb.connect(str(db_path)).close()  # and the file is free for a writer again


def _numbered(count):
    return [("SELECT $n AS n, (SELECT count(*) FROM rejects) AS rejects", {"n": n}) for n in range(count)]


def test_arrows_gives_each_result_in_order_on_every_route(db_path):
    """Several queries at once: on a scratch connection, a held file, a file opened per call and a
    served file, the results come back in the order asked and the file is free afterwards."""
    expected = [(n, 1) for n in range(7)]

    def results(database):
        return [tuple(table.to_pylist()[0].values()) for table in database.arrows(_numbered(7), ahead=3)]

    scratch = duckdb.connect(str(db_path))
    assert results(Database.over(scratch, "scratch")) == expected
    scratch.close()
    database = connect(db_path)
    with database.held():
        assert results(database) == expected
    assert results(database) == expected
    duckdb.connect(str(db_path)).close()
    con = duckdb.connect(str(db_path))
    with QueryServer(con, db_path):
        assert results(connect(db_path)) == expected
    con.close()


def test_arrows_raises_a_failing_query_and_releases_the_file(db_path):
    database = connect(db_path)
    with database.held(), pytest.raises(QueryError, match="no_such_table"):
        list(database.arrows([*_numbered(3), ("SELECT * FROM no_such_table", None), *_numbered(3)]))
    duckdb.connect(str(db_path)).close()


def test_values_are_bound_never_pasted(db_path):
    database = connect(db_path)
    hostile = "x' OR '1'='1"
    assert database.fetchall("SELECT count(*) FROM rejects WHERE topic = ?", [hostile]) == [(0,)]


def test_read_only_sessions_cannot_write(db_path):
    with pytest.raises(QueryError):
        connect(db_path).execute("DELETE FROM rejects")
    with pytest.raises(QueryError):
        connect(db_path).arrow("DELETE FROM rejects")
    assert connect(db_path).fetchall("SELECT count(*) FROM rejects") == [(1,)]


def test_queries_go_through_the_server_while_the_writer_holds_the_file(db_path):
    con = duckdb.connect(str(db_path))
    with QueryServer(con, db_path):
        assert sidecar_path(db_path).exists()
        con.execute("INSERT INTO rejects (topic, partition, kafka_offset, reason) VALUES ('t', 0, 2, 'fresh')")
        database = connect(db_path)
        assert database.fetchall("SELECT count(*) FROM rejects") == [(2,)]
        with pytest.raises(QueryError, match="read-only"):
            database.arrow("DROP TABLE rejects")
        with pytest.raises(QueryError, match="Catalog Error"):
            database.arrow("SELECT * FROM no_such_table")
        writer = connect(db_path, read_only=False)
        writer.execute("CREATE TABLE flow_result AS SELECT 42 AS answer")
        assert database.fetchall("SELECT answer FROM flow_result") == [(42,)]
    assert not sidecar_path(db_path).exists()
    con.close()


def test_a_holder_that_serves_nothing_gets_a_clear_busy_error(db_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_FILE, str(db_path), "30"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        started = time.monotonic()
        with pytest.raises(DatabaseBusy) as error:
            connect(db_path, wait_s=0.5).fetchall("SELECT 1")
        assert time.monotonic() - started < 5
        assert str(holder.pid) in str(error.value)
    finally:
        holder.kill()
        holder.wait()


def test_a_reader_waits_out_a_short_holder(db_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_FILE, str(db_path), "1"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        assert connect(db_path, wait_s=10).fetchall("SELECT count(*) FROM rejects") == [(1,)]
    finally:
        holder.wait()


@pytest.mark.parametrize("served", [False, True], ids=["file", "server"])
def test_a_script_may_call_only_listed_procedures_and_fails_whole(db_path, served):
    with contextlib.ExitStack() as stack:
        if served:
            holder = stack.enter_context(contextlib.closing(duckdb.connect(str(db_path))))
            stack.enter_context(QueryServer(holder, db_path))
        writer = connect(db_path, read_only=False)
        with pytest.raises(QueryError, match="no such procedure"):
            writer.script([("DELETE FROM rejects", None), ("procedure:os.system", {"run": "r"})])
        assert connect(db_path).fetchall("SELECT count(*) FROM rejects") == [(1,)]  # the delete rolled back
