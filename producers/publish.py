"""Publishing what the file readers read: one producer per rank, through the bus.

Imported data takes the same path as live data (producer, topics, materializer), so it lands in
the same tables. The readers check every input completely first; only when all of it is good is
anything published here, so a bad file never leaves half an import behind. Each rank's data is
published under a session id derived from the input's bytes: importing the same file again
produces the same batch keys, and the materializer drops the repeat.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable

from rankstream.producers.batch_file import BatchFile
from rankstream.producers.fr_reader import read_fr_directory
from rankstream.producers.import_trace import TRACE_BASE_KEY, TraceFile, file_parts, scan_files
from rankstream.producers.importing import ImportSummary
from rankstream.producers.producer import Producer
from rankstream.schemas.config import Config
from rankstream.schemas.errors import BrokerUnavailable, RankstreamError

__all__ = ["publish_fr_dumps", "publish_traces", "publish_ranks"]

#: Flight Recorder entries, or rejected items, per message.
_RECORDS_PER_MESSAGE = 1000


#: An importer waits while a producer holds more events than this: it reads files faster than the
#: bus takes them, and without backpressure its queue (so its memory) would grow with the file.
IMPORT_BACKLOG_EVENTS = 20_000


def wait_for_room(producer, limit: int = IMPORT_BACKLOG_EVENTS) -> None:
    """Block (an importer, never a training thread) until ``producer`` has sent its backlog down to ``limit``."""
    while producer.stats().buffered_events > limit:
        time.sleep(0.002)


def publish_ranks(config: Config, run_id: str, ranks: list[int], *, world_size: int, session_id: str,
                  fill: Callable[[dict[int, Producer]], dict[int, int]], summary: ImportSummary) -> None:
    """Run ``fill`` with one producer per rank (it returns records per rank) and make sure every
    message left. Session ids are ``<session_id>-<rank>``, so a re-import repeats its batch keys."""
    # No announcements are awaited: an import is repeatable, and its command checks what was stored.
    producers = {rank: Producer(run_id=run_id, rank=rank, world_size=world_size, config=config,
                                session_id=f"{session_id}-{rank}", confirm_stored=False) for rank in ranks}
    try:
        for rank, count in fill(producers).items():
            summary.ranks[rank] = summary.ranks.get(rank, 0) + count
    finally:
        stats = {rank: producer.close(timeout_s=60) for rank, producer in producers.items()}
    for rank, stat in stats.items():
        if stat.events_dropped:
            raise RankstreamError(f"rank {rank}: {stat.events_dropped} events could not be sent ({stat.last_error})")
        if stat.broker != "up":
            raise BrokerUnavailable(f"rank {rank}: the broker at {config.bootstrap_servers} is not reachable "
                                  f"({stat.last_error}); the data waits in the spool {config.spool_dir}")
    for producer in producers.values():
        summary.messages += sum(producer.messages_sent().values())
        summary.sessions.append(producer.session_id)


def publish_fr_dumps(config: Config, directory: Path, *, prefix: str = "rank",
                     run_id: str | None = None) -> ImportSummary:
    """Check every dump of ``directory``, then publish them through the bus, one producer per rank."""
    dumps = read_fr_directory(directory, prefix)
    world_size = max(len(dumps), max(d.rank for d in dumps) + 1,
                     max((max(g["ranks"]) + 1 for d in dumps for g in d.groups if g["ranks"]), default=0))
    summary = ImportSummary(run_id=run_id or f"fr-{directory.resolve().name}")
    for dump in dumps:
        def fill(producers, dump=dump) -> dict[int, int]:
            producer = producers[dump.rank]
            if dump.backend:
                producer.emit_rank_metadata(backend=dump.backend, metadata={"imported_from": str(dump.path)})
            if dump.groups:
                producer.emit_process_groups(dump.groups)
            for start in range(0, len(dump.entries), _RECORDS_PER_MESSAGE):
                producer.emit_fr_entries(dump.entries[start:start + _RECORDS_PER_MESSAGE])
            if dump.status:
                producer.set_collectives(dump.status)
            for start in range(0, len(dump.rejects), _RECORDS_PER_MESSAGE):
                producer.emit_input_rejects(dump.rejects[start:start + _RECORDS_PER_MESSAGE])
            return {dump.rank: len(dump.entries)}

        publish_ranks(config, summary.run_id, [dump.rank], world_size=world_size, session_id=dump.session_id, fill=fill, summary=summary)
        summary.rejected += len(dump.rejects)
    return summary


def _emit_events(info: TraceFile, batches: BatchFile, producers: dict) -> dict[int, int]:
    """Publish the file's batches, each to the producer of its rank, and the file's time base (the
    GPU analyses put times on the file's microsecond grid, as HTA reads them)."""
    for producer in producers.values():
        producer.emit_rank_metadata(metadata={"imported_from": str(info.path), TRACE_BASE_KEY: info.base_ns})
    first = producers[min(producers)]
    for start in range(0, len(info.rejects), _RECORDS_PER_MESSAGE):
        first.emit_input_rejects(info.rejects[start:start + _RECORDS_PER_MESSAGE])
    counts = dict.fromkeys(producers, 0)
    for rank, part in file_parts(info, batches):
        if rank in producers:
            producers[rank].emit_batch(part)
            counts[rank] += part.count
            wait_for_room(producers[rank])
    return counts


def publish_traces(config: Config, paths: list[Path], *, run_id: str | None = None,
                   rank: int | None = None) -> ImportSummary:
    """Check every file, then publish their events through the bus (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="rankstream-import-") as directory:
        scanned = scan_files(paths, rank, config.producer.batch_events, directory=Path(directory))
        ranks = {s.rank for s in scanned if s.rank is not None} | {p for s in scanned if s.ranks_from_pid for p in s.pids}
        world_size = max([len(paths)] + [r + 1 for r in ranks] + [s.world_size or 0 for s in scanned])
        summary = ImportSummary(run_id=run_id or f"trace-{scanned[0].path.name.split('.')[0]}")
        for index, info in enumerate(scanned):
            targets = sorted(info.pids) if info.ranks_from_pid else [info.rank]
            with BatchFile(Path(directory) / str(index)) as batches:
                publish_ranks(config, summary.run_id, targets, world_size=world_size, session_id=info.session_id,
                              fill=lambda producers, info=info, batches=batches: _emit_events(info, batches, producers),
                              summary=summary)
            summary.rejected += len(info.rejects)
    return summary
