"""Backfill through the bus: what the FR and trace importers share.

Imported data takes the same path as live data (producer, topics, materializer), so it lands in
the same tables. An import first reads and checks every input completely; only when all of it is
good does it publish anything, so a bad file never leaves half an import behind. Each rank's data
is published under a session id derived from the input's bytes: importing the same file again
produces the same batch keys, and the materializer drops the repeat.

Waiting until the data is in DuckDB is the consumers' side (``consumers.imports``).
"""

from __future__ import annotations

import gc
import hashlib
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from rankstream.schemas.config import Config
from rankstream.schemas.errors import BadInput, RankstreamError

if TYPE_CHECKING:
    from rankstream.producers.producer import Producer

__all__ = ["ImportSummary", "content_session_id", "publish_ranks", "check_input_file",
           "paused_gc"]

#: Files above this size are refused; nothing rankstream imports legitimately comes close.
MAX_INPUT_BYTES = 64 << 30


@dataclass
class ImportSummary:
    run_id: str
    ranks: dict[int, int] = field(default_factory=dict)  # rank -> records imported
    messages: int = 0
    sessions: list[str] = field(default_factory=list)
    materialized: bool = False


def check_input_file(path: Path) -> None:
    """Refuse what cannot be an input file, with one line naming it."""
    if path.is_symlink() and not path.exists():
        raise BadInput(f"{path}: broken symbolic link")
    if path.is_dir():
        raise BadInput(f"{path}: is a directory, expected a file")
    if not path.exists():
        raise BadInput(f"{path}: no such file")
    if not path.is_file():  # a FIFO or device would block or never end
        raise BadInput(f"{path}: not a regular file")
    size = path.stat().st_size
    if size == 0:
        raise BadInput(f"{path}: empty file")
    if size > MAX_INPUT_BYTES:
        raise BadInput(f"{path}: {size} bytes is larger than the {MAX_INPUT_BYTES}-byte limit")


@contextmanager
def paused_gc():
    """Pause the cyclic garbage collector while an importer parses: a parsed dump or trace is tens
    of thousands of small objects with no cycles, which reference counting frees. Collecting them
    as they appear took a third of the dump loader's time, and three quarters of orjson's."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


#: An importer waits while a producer holds more events than this: it reads files faster than the
#: bus takes them, and without backpressure its queue (so its memory) would grow with the file.
IMPORT_BACKLOG_EVENTS = 20_000


def wait_for_room(producer, limit: int = IMPORT_BACKLOG_EVENTS) -> None:
    """Block (an importer, never a training thread) until ``producer`` has sent its backlog down to ``limit``."""
    while producer.stats().buffered_events > limit:
        time.sleep(0.002)


def content_session_id(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
    return "import-" + digest.hexdigest()[:16]


def publish_ranks(config: Config, run_id: str, ranks: list[int], world_size: int, session_id: str,
                  fill: Callable[[dict[int, Producer]], dict[int, int]], summary: ImportSummary) -> None:
    """Run ``fill`` with one producer per rank (it returns records per rank) and make sure every
    message left. Session ids are ``<session_id>-<rank>``, so a re-import repeats its batch keys."""
    from rankstream.producers.producer import Producer  # only publishing needs it (see the package)

    producers = {rank: Producer(run_id=run_id, rank=rank, world_size=world_size, config=config,
                                session_id=f"{session_id}-{rank}") for rank in ranks}
    try:
        for rank, count in fill(producers).items():
            summary.ranks[rank] = summary.ranks.get(rank, 0) + count
    finally:
        stats = {rank: producer.close(timeout_s=60) for rank, producer in producers.items()}
    for rank, stat in stats.items():
        if stat.events_dropped:
            raise RankstreamError(f"rank {rank}: {stat.events_dropped} events could not be sent ({stat.last_error})")
        if stat.broker != "up":
            raise RankstreamError(f"rank {rank}: the broker at {config.bootstrap_servers} is not reachable "
                                  f"({stat.last_error}); the data waits in the spool {config.spool_dir}")
    for producer in producers.values():
        summary.messages += sum(producer.messages_sent().values())
        summary.sessions.append(producer.session_id)
