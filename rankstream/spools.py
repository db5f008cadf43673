"""``rankstream flush`` (and ``up``): deliver the spools producers left in this state dir.

A producer whose job ended while no broker was reachable leaves its events in
``<state_dir>/spool/<run>/rank<r>/*.seg``. Each segment is sent, then deleted only once the
materializer has stored every batch key it held; a segment whose messages are not all stored in
time (or were rejected) stays, and is named.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from rankstream.consumers.query import connect
from rankstream.producers.spool import left_behind
from rankstream.producers.spool_delivery import SentSegment, send_segment
from rankstream.producers.transport import KafkaTransport
from rankstream.schemas.config import Config
from rankstream.schemas.errors import BrokerUnavailable

__all__ = ["SpoolDelivery", "deliver_spools"]

STORED_SQL = """
SELECT count(*) FROM ingested_batches i
JOIN (SELECT unnest($runs) AS run_id, unnest($ranks) AS rank, unnest($streams) AS stream,
             unnest($sessions) AS session_id, unnest($seqs) AS seq) k USING (run_id, rank, stream, session_id, seq)
"""


@dataclass
class SpoolDelivery:
    segments: int = 0
    messages: int = 0
    events: int = 0
    #: Segments still on disk afterwards, with why.
    kept: list[tuple[Path, str]] = field(default_factory=list)

    def line(self) -> str:
        text = f"delivered {self.events:,} spooled events ({self.messages:,} messages, {self.segments} segments)"
        if self.kept:
            text += f"; {len(self.kept)} segment(s) kept: " + "; ".join(f"{p} ({why})" for p, why in self.kept[:3])
        return text


def deliver_spools(config: Config, wait_s: float = 60.0) -> SpoolDelivery | None:
    """Send every left-behind segment and delete those the materializer stored; None if there were none."""
    segments = left_behind(config.spool_dir)
    if not segments:
        return None
    transport = KafkaTransport(config)
    if not transport.connect():
        raise BrokerUnavailable(f"no broker at {config.bootstrap_servers}: the spool stays in {config.spool_dir}")
    result = SpoolDelivery()
    sent: list[SentSegment] = []
    try:
        for path in segments:
            segment = send_segment(transport, path)
            if segment.error:
                result.kept.append((path, f"not acknowledged: {segment.error}"))
            else:
                sent.append(segment)
    finally:
        transport.close()
    database = connect(config.db_path)
    deadline = time.monotonic() + wait_s
    while sent:
        waiting = []
        for segment in sent:
            if _all_stored(database, segment):
                segment.path.unlink(missing_ok=True)
                result.segments += 1
                result.messages += segment.messages
                result.events += segment.events
            else:
                waiting.append(segment)
        sent = waiting
        if sent and time.monotonic() > deadline:
            result.kept += [(s.path, "sent, not stored by the materializer yet") for s in sent]
            break
        time.sleep(0.2 if sent else 0)
    _remove_empty_folders(config.spool_dir)
    return result


def _all_stored(database, segment: SentSegment) -> bool:
    if len(segment.keys) < segment.messages:
        return False  # a message that does not decode went to rejects: the segment is kept for a look
    keys = segment.keys
    stored = database.fetchall(STORED_SQL, {
        "runs": [k.run_id for k in keys], "ranks": [k.rank for k in keys], "streams": [k.stream.value for k in keys],
        "sessions": [k.session_id for k in keys], "seqs": [k.seq for k in keys]})[0][0]
    return stored >= len(keys)


def _remove_empty_folders(root: Path) -> None:
    for folder in sorted(root.glob("*/rank*"), reverse=True) + sorted(root.glob("*")):
        try:
            folder.rmdir()  # only when empty
        except OSError:
            pass
