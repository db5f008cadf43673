"""The envelope: the one frozen shape of every message on the bus.

The envelope carries who sent a payload and where it sits in that sender's stream. The key
``(run_id, rank, stream, session_id, seq)`` identifies a batch exactly once: ``session_id`` is
new each time a producer process starts and ``seq`` counts that session's messages on one
stream from 0 with no gaps, so the materializer can drop resends and spot losses.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = ["Stream", "PayloadKind", "Envelope", "BatchKey", "ENVELOPE_VERSION"]

ENVELOPE_VERSION = 1


class Stream(str, enum.Enum):
    """Independent ordered streams of one producer; each has its own sequence numbers and topic."""

    TRACE = "trace"
    FR = "fr"
    CONTROL = "control"


class PayloadKind(str, enum.Enum):
    """What the payload is. Each kind travels on one stream."""

    TRACE_BATCH = "trace_batch"
    FR_BATCH = "fr_batch"
    PG_CONFIG = "pg_config"
    RANK_META = "rank_meta"
    HEARTBEAT = "heartbeat"
    INPUT_REJECTS = "input_rejects"

    @property
    def stream(self) -> Stream:
        return _STREAM_OF[self]


_STREAM_OF = {
    PayloadKind.TRACE_BATCH: Stream.TRACE,
    PayloadKind.FR_BATCH: Stream.FR,
    PayloadKind.PG_CONFIG: Stream.FR,
    PayloadKind.RANK_META: Stream.CONTROL,
    PayloadKind.HEARTBEAT: Stream.CONTROL,
    PayloadKind.INPUT_REJECTS: Stream.CONTROL,
}


@dataclass(frozen=True, slots=True)
class BatchKey:
    """Identity of one message, used to deduplicate producer resends."""

    run_id: str
    rank: int
    stream: Stream
    session_id: str
    seq: int


@dataclass(frozen=True, slots=True)
class Envelope:
    """One bus message. ``payload`` is the decoded payload object of ``kind``."""

    run_id: str
    rank: int
    world_size: int
    stream: Stream
    session_id: str
    seq: int
    kind: PayloadKind
    payload_version: int
    sent_at_ns: int
    payload: Any

    @property
    def key(self) -> BatchKey:
        return BatchKey(self.run_id, self.rank, self.stream, self.session_id, self.seq)
