"""User SQL reads, and only reads, by construction (``rankstream sql``, ``rankstream.connect()``).

Two independent layers, so that neither has to be perfect on its own:

1. **The statement.** Each statement is classified by DuckDB's own parser; a read session runs
   only SELECT (``SUMMARIZE``, ``DESCRIBE``, ``SHOW`` and ``FROM t`` parse as SELECT) and EXPLAIN of
   a statement that is itself a read. ``EXPLAIN ANALYZE`` executes its statement, so
   ``EXPLAIN ANALYZE DELETE ...`` is a delete and is refused.
2. **The instance.** A SELECT can still reach the host through table functions (``read_text``,
   ``read_csv``, ``glob``) or install extensions. The instance that answers user SQL therefore has
   external access off, extension install and autoload off, and its configuration locked: the
   materializer's own instance once it is set up (it ingests registered Arrow data and writes no
   file through DuckDB), or, when no materializer holds the file, the read-only instance that
   opens it with those settings.

A read that runs past its timeout, or whose client went away, is interrupted.
"""

from __future__ import annotations

import re
import select
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import duckdb

__all__ = ["check_read_only", "lock_down", "open_read_only", "interrupted_when", "LOCKED"]

#: The instance settings that close it to the host; the last one freezes the others (DuckDB applies
#: them to the whole instance, not to one connection).
LOCKED = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "enable_external_access": False,
    "lock_configuration": True,
}
#: Loaded before the lockdown: the views and the analyses use them, and nothing can load them after.
EXTENSIONS = ("json",)

_READS = frozenset({"SELECT"})
#: ``EXPLAIN``, its options (``ANALYZE``, or a parenthesized list), and leading comments.
_EXPLAIN = re.compile(r"^\s*(?:(?:/\*.*?\*/|--[^\n]*\n)\s*)*EXPLAIN\b\s*(?:\((?:[^()]|\([^()]*\))*\)|ANALY[SZ]E\b)?",
                      re.IGNORECASE | re.DOTALL)


def check_read_only(connection: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise ``PermissionError`` unless every statement of ``sql`` only reads."""
    statements = connection.extract_statements(sql)
    if not statements:
        raise PermissionError("no SQL statement given")
    for statement in statements:
        kind = statement.type.name
        if kind == "EXPLAIN":
            inner = _EXPLAIN.sub("", statement.query, count=1)
            explained = connection.extract_statements(inner) if inner.strip() else []
            if len(explained) != 1 or explained[0].type.name not in _READS:
                raise PermissionError(f"this session is read-only: EXPLAIN runs (with ANALYZE) or describes a "
                                      f"{explained[0].type.name if explained else 'missing'} statement here")
        elif kind not in _READS:
            raise PermissionError(f"this session is read-only: {kind} statements need write access "
                                  "(rankstream sql --write)")


def lock_down(connection: duckdb.DuckDBPyConnection) -> None:
    """Close the instance to the host for good (see the module docstring)."""
    for name in EXTENSIONS:
        connection.execute(f"LOAD {name}")
    for setting, value in LOCKED.items():
        connection.execute(f"SET {setting} = {str(value).lower()}")


def open_read_only(db_path: Path) -> duckdb.DuckDBPyConnection:
    """``db_path`` opened read-only, its instance locked down from the start: how a read-only
    session opens a file no materializer holds."""
    return duckdb.connect(str(db_path), read_only=True, config=dict(LOCKED))


@contextmanager
def interrupted_when(connection: duckdb.DuckDBPyConnection, *, timeout_s: float | None,
                     client: socket.socket | None = None, poll_s: float = 0.2) -> Iterator[dict]:
    """Interrupt what ``connection`` runs inside the block after ``timeout_s``, or as soon as
    ``client`` hangs up. The yielded dict says why it was interrupted (``reason``), if it was."""
    done, outcome = threading.Event(), {"reason": None}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def watch() -> None:
        while not done.wait(poll_s):
            if deadline is not None and time.monotonic() >= deadline:
                outcome["reason"] = f"the query ran past its {timeout_s:g} s timeout (--timeout)"
            elif client is not None and _hung_up(client):
                outcome["reason"] = "its client went away"
            else:
                continue
            connection.interrupt()
            return

    watcher = threading.Thread(target=watch, name="rankstream-query-watch", daemon=True)
    watcher.start()
    try:
        yield outcome
    finally:
        done.set()
        watcher.join()


def _hung_up(client: socket.socket) -> bool:
    """Whether the peer closed its end (readable with nothing to read); never consumes data."""
    try:
        readable, _, _ = select.select([client], [], [], 0)
        return bool(readable) and client.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
