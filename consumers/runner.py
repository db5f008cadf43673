"""Running a materializer over the database file: open it, serve SQL, run the watchers, consume.

What runs beside the materializer loop is passed in by whoever starts it (``rankstream consume``
wires the live hang watch of ``flows``), so this layer never imports the analyses above it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Protocol, Sequence

import duckdb

from rankstream.consumers.materializer import RETRY_S, Materializer, MaterializerStatus
from rankstream.consumers.query_server import QueryServer
from rankstream.consumers.sql_guard import lock_down
from rankstream.consumers.store import Store, open_writable
from rankstream.schemas.config import Config
from rankstream.schemas.errors import DatabaseBusy

__all__ = ["Watcher", "run_materializer"]


class Watcher(Protocol):
    """Something that works on the materializer's connection while it runs (the live hang watch)."""

    def start(self) -> None: ...
    def stop(self) -> None: ...


def _open(config: Config, stop: threading.Event, log: Callable[[str], None]) -> duckdb.DuckDBPyConnection | None:
    """The database opened for writing, waiting while another process holds it (None if stopped)."""
    complained = False
    while not stop.is_set():
        try:
            return open_writable(config.db_path)
        except DatabaseBusy as exc:  # transient: another process holds the file
            if not complained:  # one line, not one per retry
                log(f"rankstream materializer: {exc} (retrying every {RETRY_S:.0f} s)")
                complained = True
            stop.wait(RETRY_S)
    return None


def run_materializer(config: Config, stop: threading.Event, *, once: bool = False, rebuild: bool = False,
                     query_server: bool = True, max_messages: int = 500,
                     watchers: Sequence[Callable[[duckdb.DuckDBPyConnection], Watcher]] = (),
                     log: Callable[[str], None] = print) -> MaterializerStatus:
    """Open the database, then materialize and serve SQL until ``stop`` is set, with each of
    ``watchers`` (built on the connection) running beside it.

    ``rebuild`` empties every projection and replays all partitions from offset 0; ``once`` stops
    when the offsets seen at start are reached (and starts no watchers).
    """
    connection = _open(config, stop, log)
    if connection is None:
        return MaterializerStatus(pid=os.getpid(), started_at=time.time(), updated_at=time.time())
    try:
        connection.execute(f"SET memory_limit = '{config.materializer_memory_mb}MB'")
        lock_down(connection)  # user SQL runs on this instance: it cannot reach the host (sql_guard)
        store = Store(connection)
        if rebuild:
            store.reset()
            log(f"rankstream materializer: emptied {config.db_path}; replaying every partition from offset 0")
        server = QueryServer(connection, config.db_path) if query_server else None
        running = [make(connection) for make in watchers] if not once else []
        for service in ([server] if server else []) + running:
            service.start()
        try:
            return Materializer(config, store, log=log, max_records=max_messages).run(stop, until_caught_up=once)
        finally:
            for service in reversed(([server] if server else []) + running):
                service.stop()
    finally:
        connection.close()
