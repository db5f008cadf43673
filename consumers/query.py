"""Query the rankstream database from any process, whether or not a materializer holds it.

``connect(db_path)`` finds its way in:

* a materializer is running for this file: SQL goes to its query server (see ``query_server``);
  results are at most one poll old and no file lock is ever taken;
* nobody holds the file: each call opens it for that call only (read-only unless asked) and
  closes it at once, so a long-lived client never keeps a materializer from starting (a command
  that runs many queries in a row holds one connection for a while: ``Database.held()``);
* another process holds the file without serving queries (a one-shot ``consume --once``):
  calls wait for it to finish, up to ``wait_s``, then raise :class:`DatabaseBusy` naming it.

Every call binds values as parameters (a list for ``?``/``$1``, a dict for ``$name``); nothing the
caller passes is pasted into SQL.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import duckdb
import pyarrow as pa

from rankstream.consumers.query_protocol import ServerError, read_response, send_request, send_script
from rankstream.consumers.query_server import bindable_params, execute_script, run_guarded, server_socket
from rankstream.consumers.sql_guard import open_read_only
from rankstream.schemas.errors import DatabaseBusy, QueryError, RankstreamError
from rankstream.schemas.settings import load_config

__all__ = ["connect", "Database"]


class Database:
    """A handle on a rankstream DuckDB file. Methods mirror DuckDB's, returning copies of results."""

    def __init__(self, db_path: Path, read_only: bool = True, wait_s: float = 10.0, *,
                 timeout_s: float | None = None) -> None:
        self.path = Path(db_path)
        self.read_only = read_only
        self.wait_s = wait_s
        #: Each query is interrupted past this (``rankstream sql --timeout``); None: never.
        self.timeout_s = timeout_s
        #: Inside :meth:`held`: True, then the connection every local call shares.
        self._holding = False
        self._held: duckdb.DuckDBPyConnection | None = None
        #: Set by :meth:`over`: the one connection every call runs on, never closed here.
        self._own: duckdb.DuckDBPyConnection | None = None
        #: In :meth:`arrows`' worker threads: the thread's own cursor on the shared connection.
        self._thread = threading.local()
        self._opening = threading.Lock()

    @classmethod
    def over(cls, connection: duckdb.DuckDBPyConnection, name: str) -> "Database":
        """A Database whose calls all run on ``connection``: a scratch database that a command
        fills and analyzes itself (``rankstream merge`` keeps its one in memory). No server is
        looked for and no file opened; ``name`` stands for the path in messages."""
        database = cls(Path(name), read_only=False)
        database._own = connection
        return database

    @contextlib.contextmanager
    def held(self) -> Iterator["Database"]:
        """Calls inside the block that open the file themselves share one connection, opened at
        the first and closed at the end. Opening the file is not free, so a command that
        runs many queries (a timeline: a few per rank) holds it; meanwhile a materializer cannot
        start on the file. Calls that go to a query server are unchanged."""
        self._holding = True
        try:
            yield self
        finally:
            self._holding = False
            held, self._held = self._held, None
            if held is not None:
                held.close()

    # -- results in the shape the caller wants -------------------------------------------------
    def arrow(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        return self._run(sql, params, write=False)

    def arrows(self, queries: Iterable[tuple[str, Sequence[Any] | dict | None]], ahead: int = 2) -> Iterator[pa.Table]:
        """Each query's result in order, with up to ``ahead`` of them running at once (a timeline's
        slices: the next one is built while this one is written). A query over a few row groups
        leaves a core idle: a timeline of 330k events took 0.33-0.39 s this way against 0.39-0.58 s
        one query at a time. The queries are drawn from ``queries`` as results are taken, and at
        most ``ahead`` results wait in memory.
        On a shared connection each worker has its own cursor, so the queries see the database's
        tables but not the connection's temporary ones."""
        cursors: list[duckdb.DuckDBPyConnection] = []

        def worker() -> None:  # its cursor is made at its first local call: a served file has none
            self._thread.cursors, self._thread.cursor = cursors, None

        try:
            with ThreadPoolExecutor(ahead, initializer=worker) as pool:
                pending: deque = deque()
                for sql, params in queries:
                    pending.append(pool.submit(self.arrow, sql, params))
                    if len(pending) >= ahead:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
        finally:
            for cursor in cursors:
                cursor.close()

    def fetchall(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
        table = self.arrow(sql, params)
        return list(zip(*(column.to_pylist() for column in table.columns))) if table.num_columns else []

    def sql(self, sql: str, params: Sequence[Any] | None = None) -> duckdb.DuckDBPyRelation:
        """A DuckDB relation over the result (held in memory), to filter, join or ``.df()`` further."""
        result = self.arrow(sql, params)
        return duckdb.connect().from_arrow(result)

    def df(self, sql: str, params: Sequence[Any] | None = None):
        """A pandas DataFrame (needs pandas installed)."""
        try:
            return self.arrow(sql, params).to_pandas()
        except ModuleNotFoundError as exc:
            raise RankstreamError("Database.df() needs pandas: pip install pandas (or use .arrow())") from exc

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        """Run statements that write (flows creating result tables). Needs ``read_only=False``."""
        if self.read_only:
            raise QueryError("this Database was opened read-only; connect(read_only=False) to write")
        return self._run(sql, params, write=True)

    def script(self, statements: Sequence[tuple[str, Sequence[Any] | dict | None]]) -> None:
        """Run several writing statements in one transaction (an analysis replacing a run's rows):
        readers see the old rows or the new ones, never a mix, and a failure changes nothing."""
        if self.read_only:
            raise QueryError("this Database was opened read-only; connect(read_only=False) to write")
        self._route(lambda path: self._remote_script(path, statements),
                    lambda: self._local_call(lambda con: execute_script(con, statements), write=True))

    # -- routing ---------------------------------------------------------------------------------
    def _run(self, sql: str, params: Sequence[Any] | None, write: bool) -> pa.Table:
        return self._route(lambda path: self._remote(path, sql, params, write),
                           lambda: self._local_call(lambda con: self._local_query(con, sql, params, write), write))

    def _local_query(self, connection, sql: str, params, write: bool) -> pa.Table:
        try:
            return run_guarded(connection, sql, params, write=write, timeout_s=self.timeout_s)
        except (PermissionError, TimeoutError) as exc:
            raise QueryError(str(exc)) from None

    def _route(self, remote, local):
        if self._own is not None:
            return local()
        deadline = time.monotonic() + self.wait_s
        holder = ""
        while True:
            path = server_socket(self.path)
            if path is not None:
                try:
                    return remote(path)
                except (ConnectionError, OSError):
                    pass  # the server went away between lookup and call; fall through to the file
            try:
                return local()
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower():
                    raise QueryError(f"{self.path}: {exc}") from exc
                holder = str(exc).split("Conflicting lock is held in", 1)[-1].strip()
            if time.monotonic() >= deadline:
                raise DatabaseBusy(
                    f"{self.path} is held by another process ({holder or 'unknown'}) that serves no queries; "
                    f"waited {self.wait_s:.0f} s. Run `rankstream up` (its materializer serves SQL) or wait for it."
                )
            time.sleep(0.1)

    def _remote(self, socket_path: str, sql: str, params, write: bool) -> pa.Table:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(socket_path)
            send_request(sock, sql, bindable_params(params), write=write, timeout_s=self.timeout_s)
            try:
                return read_response(sock)
            except ServerError as exc:
                raise QueryError(str(exc)) from None

    def _remote_script(self, socket_path: str, statements) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(socket_path)
            send_script(sock, [(sql, params) for sql, params in statements])
            try:
                read_response(sock)
            except ServerError as exc:
                raise QueryError(str(exc)) from None

    def _shared_connection(self) -> duckdb.DuckDBPyConnection | None:
        """The connection every local call shares (:meth:`over`, or inside :meth:`held`, opened at
        the first call), or in an :meth:`arrows` worker the thread's own cursor on it (DuckDB
        connections are not for concurrent use); None when each call opens the file for itself."""
        if self._own is None and not self._holding:
            return None
        with self._opening:
            if self._own is None and self._held is None:
                self._held = open_read_only(self.path) if self.read_only else duckdb.connect(str(self.path))
        shared = self._own if self._own is not None else self._held
        if getattr(self._thread, "cursors", None) is None:  # not in a worker
            return shared
        if self._thread.cursor is None:
            self._thread.cursor = shared.cursor()
            self._thread.cursors.append(self._thread.cursor)
        return self._thread.cursor

    def _local_call(self, work, write: bool):
        if self._own is None and not self.path.exists() and not write:
            raise QueryError(f"{self.path}: no such database yet (start the materializer: rankstream up)")
        shared = self._shared_connection()
        connection = shared or (duckdb.connect(str(self.path)) if write else open_read_only(self.path))
        try:
            return work(connection)
        except duckdb.IOException:
            raise
        except duckdb.Error as exc:
            raise QueryError(f"{type(exc).__name__}: {exc}") from None
        except PermissionError as exc:  # a script naming a procedure that is not listed
            raise QueryError(str(exc)) from None
        finally:
            if shared is None:
                connection.close()


def connect(db_path: "str | Path | Database | None" = None, *, read_only: bool = True, wait_s: float = 10.0,
            timeout_s: float | None = None) -> Database:
    """A :class:`Database` for ``db_path`` (default: the configured ``db_path``); a Database
    passed in is returned as it is, so the flows run on a scratch one too."""
    if isinstance(db_path, Database):
        return db_path
    if db_path is None:
        db_path = load_config().db_path
    return Database(Path(db_path), read_only=read_only, wait_s=wait_s, timeout_s=timeout_s)
