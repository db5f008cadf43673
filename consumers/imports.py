"""Imports end to end: publish files through the bus, then wait until DuckDB holds all of it.

The readers (``producers.fr_reader``, ``producers.import_trace``) check, ``producers.publish`` publishes; the wait is
here because it reads the database: through the running materializer if there is one, otherwise
by materializing once in this process.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rankstream.consumers.query import connect
from rankstream.consumers.query_server import server_socket
from rankstream.consumers.runner import run_materializer
from rankstream.producers.publish import publish_fr_dumps, publish_traces
from rankstream.producers.importing import ImportSummary
from rankstream.schemas.config import Config
from rankstream.schemas.errors import RankstreamError

__all__ = ["import_fr", "import_traces", "wait_materialized"]


def import_fr(config: Config, directory: Path, *, prefix: str = "rank", run_id: str | None = None) -> ImportSummary:
    """``rankstream import fr``: every dump of ``directory`` published, then stored."""
    summary = publish_fr_dumps(config, directory, prefix=prefix, run_id=run_id)
    wait_materialized(config, summary)
    return summary


def import_traces(config: Config, paths: list[Path], *, run_id: str | None = None,
                  rank: int | None = None) -> ImportSummary:
    """``rankstream import trace``: every file checked and published, then stored."""
    summary = publish_traces(config, paths, run_id=run_id, rank=rank)
    wait_materialized(config, summary)
    return summary


def wait_materialized(config: Config, summary: ImportSummary, timeout_s: float = 300.0) -> None:
    """Block until DuckDB holds every message of the import."""
    if server_socket(config.db_path) is None:
        run_materializer(config, threading.Event(), once=True, query_server=False, log=lambda line: None)
    database = connect(config.db_path, wait_s=30)
    placeholders = ", ".join("?" for _ in summary.sessions)
    deadline = time.monotonic() + timeout_s
    while True:
        stored = database.fetchall(
            f"SELECT count(*) FROM ingested_batches WHERE run_id = ? AND session_id IN ({placeholders})",
            [summary.run_id, *summary.sessions])[0][0]
        if stored >= summary.messages:
            summary.materialized = True
            return
        if time.monotonic() > deadline:
            raise RankstreamError(f"only {stored} of {summary.messages} imported messages reached "
                                  f"{config.db_path} within {timeout_s:.0f} s; is the materializer running?")
        time.sleep(0.1)
