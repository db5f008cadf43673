"""The query server: SQL served by the process that holds the DuckDB file for writing.

DuckDB lets only one process open a file while it is written, so while the materializer runs,
everyone else (``rankstream sql``, the Python API, flows) sends SQL here instead. Each request
runs on its own cursor of the materializer's connection, so it sees every committed poll (data at
most one poll old, well under a second) and never takes a file lock. Read-only requests may only
run SELECT/EXPLAIN statements; write requests (flows writing result tables) may run anything.
"""

from __future__ import annotations

import json
import os
import socketserver
import tempfile
import threading
from pathlib import Path
from typing import Callable

import duckdb
import pyarrow as pa

from rankstream.schemas.files import write_atomically
from rankstream.schemas.processes import process_alive
from rankstream.consumers.query_protocol import read_request, send_error, send_table, sidecar_path
from rankstream.consumers.sql_guard import check_read_only, interrupted_when

__all__ = ["QueryServer", "PROCEDURE_PREFIX", "register_procedure", "bindable_params", "execute_script",
           "execute_to_arrow", "run_guarded", "server_socket"]


def run_guarded(connection: duckdb.DuckDBPyConnection, sql: str, params, *, write: bool,
                timeout_s: float | None = None, client=None) -> pa.Table:
    """One request's statement: only reads unless ``write`` (``sql_guard``), interrupted past
    ``timeout_s`` or when ``client`` hangs up (then ``TimeoutError`` says which)."""
    if not write:
        check_read_only(connection, sql)
    with interrupted_when(connection, timeout_s=timeout_s, client=client) as stopped:
        try:
            return execute_to_arrow(connection, sql, params)
        except duckdb.InterruptException:
            raise TimeoutError(f"query interrupted: {stopped['reason'] or 'by DuckDB'}") from None


#: Analysis steps written in Python that a script may name instead of SQL (``procedure:NAME``):
#: they run next to the data, on the script's connection and inside its transaction, so rows never
#: travel to the caller. Only registered names can be called; the analyses register theirs
#: (``flows.breakdown``), and a materializer started by ``rankstream consume`` loads them.
PROCEDURES: dict[str, Callable[[duckdb.DuckDBPyConnection, dict], None]] = {}
PROCEDURE_PREFIX = "procedure:"


def register_procedure(name: str, function: Callable[[duckdb.DuckDBPyConnection, dict], None]) -> None:
    PROCEDURES[name] = function


def _procedure(sql: str):
    function = PROCEDURES.get(sql[len(PROCEDURE_PREFIX):])
    if function is None:
        raise PermissionError(f"no such procedure: {sql!r} (known: {sorted(PROCEDURES)})")
    return function


#: The result of a statement that returns none. Built from a buffer: turning any Python value into
#: Arrow makes pyarrow import pandas when it is installed, 0.3-0.4 s of every command's time.
_OK = pa.Table.from_arrays([pa.Array.from_buffers(pa.bool_(), 1, [None, pa.py_buffer(b"\x01")])], names=["ok"])


def execute_script(connection: duckdb.DuckDBPyConnection, statements) -> pa.Table:
    """Run ``[(sql, params), ...]`` in one transaction: all of it commits, or none of it. A
    statement may name a procedure (see ``PROCEDURES``) instead of SQL."""
    connection.begin()
    try:
        for sql, params in statements:
            if sql.startswith(PROCEDURE_PREFIX):
                _procedure(sql)(connection, params)
            else:
                connection.execute(sql, params if params else None)
    except BaseException:
        connection.rollback()
        raise
    connection.commit()
    return _OK


def bindable_params(params):
    """Positional values as a list, named ones (``$name``) as a dict; None when there are none."""
    if not params:
        return None
    return dict(params) if isinstance(params, dict) else list(params)


def execute_to_arrow(connection: duckdb.DuckDBPyConnection, sql: str, params) -> pa.Table:
    """Run SQL and return its result as Arrow; statements without a result give ``{ok: [true]}``."""
    relation = connection.sql(sql, params=bindable_params(params))
    if relation is None:
        return _OK
    return relation.to_arrow_table()


class _Handler(socketserver.BaseRequestHandler):
    server: "_UnixServer"

    def handle(self) -> None:
        sock = self.request
        while True:
            try:
                request = read_request(sock)
            except (ConnectionError, OSError):
                return
            except ValueError as exc:
                send_error(sock, f"bad request: {exc}")
                return
            try:
                if "script" in request:
                    table = self.server.run_script(request["script"], bool(request.get("write")))
                else:
                    table = self.server.run(request["sql"], request.get("params"), bool(request.get("write")),
                                            timeout_s=request.get("timeout_s"), client=sock)
            except duckdb.Error as exc:
                send_error(sock, f"{type(exc).__name__}: {exc}")
                continue
            except (PermissionError, TimeoutError) as exc:
                send_error(sock, str(exc))
                continue
            except Exception as exc:  # answer every request; a dropped connection helps nobody
                send_error(sock, f"internal error: {type(exc).__name__}: {exc}")
                continue
            send_table(sock, table)


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, connection: duckdb.DuckDBPyConnection) -> None:
        super().__init__(path, _Handler)
        self._connection = connection

    def run(self, sql: str, params, write: bool, *, timeout_s: float | None = None, client=None):
        cursor = self._connection.cursor()
        try:
            return run_guarded(cursor, sql, params, write=write, timeout_s=timeout_s, client=client)
        finally:
            cursor.close()


    def run_script(self, statements, write: bool):
        if not write:
            raise PermissionError("a script writes: it needs a write session")
        cursor = self._connection.cursor()
        try:
            return execute_script(cursor, statements)
        finally:
            cursor.close()


class QueryServer:
    """Serves SQL on a Unix socket and advertises it in ``<db>.server.json``."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, db_path: Path) -> None:
        self._connection = connection
        self._sidecar = sidecar_path(db_path)
        self._socket_dir = tempfile.mkdtemp(prefix="rankstream-q-")
        self._socket_path = os.path.join(self._socket_dir, "sql.sock")
        self._server: _UnixServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._server = _UnixServer(self._socket_path, self._connection)
        self._thread = threading.Thread(target=self._server.serve_forever, name="rankstream-query", daemon=True)
        self._thread.start()
        write_atomically(self._sidecar, json.dumps({"pid": os.getpid(), "socket": self._socket_path}))

    def stop(self) -> None:
        try:
            if json.loads(self._sidecar.read_text()).get("pid") == os.getpid():
                self._sidecar.unlink()
        except (OSError, ValueError):
            pass
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        try:
            os.unlink(self._socket_path)
            os.rmdir(self._socket_dir)
        except OSError:
            pass

    def __enter__(self) -> "QueryServer":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def server_socket(db_path: Path) -> str | None:
    """The socket of a live query server for ``db_path``, or None."""
    try:
        info = json.loads(sidecar_path(db_path).read_text())
        pid, path = int(info["pid"]), str(info["socket"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return path if process_alive(pid) and os.path.exists(path) else None
