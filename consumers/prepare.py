"""Preparing a poll for the store: decode each message, check its key, project the accepted ones.

Pure computation with no database, so the materializer prepares the next poll while the store
commits this one. A message that cannot be used becomes a rejects row with its coordinates and
why; a resend of a message already in this poll is remembered, a conflicting one rejected.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from rankstream.consumers.projector import MESSAGE_COLUMN, project
from rankstream.schemas.codec import DecodeFailure, decode
from rankstream.schemas.envelope import Envelope
from rankstream.schemas.trace import TraceBatch
from rankstream.schemas.topics import Record, parse_message_key

__all__ = ["PreparedBatch", "prepare", "reject_row", "conflict_reason", "same_content"]


@dataclass
class PreparedBatch:
    """One poll, decoded and projected, ready for one transaction. Built without the database."""

    messages: int
    rejects: list[dict]
    #: Later copies in this poll of an accepted message, as (its index, record): resends, unless
    #: the accepted copy turns out at commit to conflict with a stored batch, then rejects too.
    repeats: list[tuple[int, Record]]
    #: One row per accepted message (its batch key), with the ``MESSAGE_COLUMN`` index.
    keys: pa.Table
    #: Projected rows per table, each row tagged with its message's ``MESSAGE_COLUMN`` index.
    tables: dict[str, pa.Table]
    next_offsets: dict[tuple[str, int], int]
    #: The accepted messages' records, by ``MESSAGE_COLUMN`` index (for a reject found at commit).
    records: list[Record] = field(default_factory=list)

    def conflict_reject(self, index: int, reason: str, record: Record | None = None) -> dict:
        """The rejects row of accepted message ``index`` (or of ``record``, a copy of it in this poll),
        found at commit to conflict with a stored batch."""
        keys = self.keys.slice(index, 1).to_pylist()[0]
        return reject_row(record or self.records[index], DecodeFailure(reason, keys["run_id"], keys["rank"]))


def prepare(records: list[Record]) -> PreparedBatch:
    """Decode and project a poll. Pure computation, so it can run while the previous poll commits."""
    accepted: list[tuple[Record, Envelope]] = []
    rejects: list[dict] = []
    seen: dict = {}  # batch key -> (index in accepted, (kind, events)) of the first message with that key
    repeats: list[tuple[int, Record]] = []
    next_offsets: dict[tuple[str, int], int] = {}
    for record in records:
        position = (record.topic, record.partition)
        next_offsets[position] = max(next_offsets.get(position, 0), record.offset + 1)
        decoded = decode(record.value)
        if not isinstance(decoded, DecodeFailure) and record.key is not None \
                and parse_message_key(record.key) != (decoded.run_id, decoded.rank):
            decoded = DecodeFailure(f"message key {record.key[:200]!r} does not match the envelope's run "
                                    f"{decoded.run_id!r} rank {decoded.rank}", decoded.run_id, decoded.rank)
        if isinstance(decoded, DecodeFailure):
            rejects.append(reject_row(record, decoded))
        elif decoded.key not in seen:
            seen[decoded.key] = (len(accepted), _content(decoded))
            accepted.append((record, decoded))
        elif same_content(seen[decoded.key][1], _content(decoded)):
            repeats.append((seen[decoded.key][0], record))  # a resend, unless its first copy conflicts
        else:
            rejects.append(reject_row(record, DecodeFailure(
                conflict_reason(seen[decoded.key][1], _content(decoded)), decoded.run_id, decoded.rank)))
    return PreparedBatch(
        messages=len(records),
        rejects=rejects,
        repeats=repeats,
        keys=_batch_keys(accepted, [seen[envelope.key][1] for _, envelope in accepted]),
        records=[record for record, _ in accepted],
        tables=project([envelope for _, envelope in accepted]),
        next_offsets=next_offsets,
    )


def reject_row(record: Record, failure: DecodeFailure) -> dict:
    key_run, key_rank = parse_message_key(record.key)
    return {
        "topic": record.topic, "partition": record.partition, "kafka_offset": record.offset,
        "message_key": record.key, "message_ts_ms": record.timestamp_ms,
        "run_id": failure.run_id or key_run,
        "rank": failure.rank if failure.rank is not None and abs(failure.rank) < 2**31 else key_rank,
        "reason": failure.reason, "raw": record.value,
    }


def _content(envelope: Envelope) -> tuple[str, int, int | None]:
    """What a resend must repeat exactly: the payload kind, its event count and, for trace
    batches, their checksum (the other payloads carry their send time, which a re-import renews)."""
    digest = envelope.payload.digest() if isinstance(envelope.payload, TraceBatch) else None
    return envelope.kind.value, getattr(envelope.payload, "count", 0), digest


def same_content(first: tuple, repeat: tuple) -> bool:
    """Whether a repeated batch key carries the same batch (a digest unknown on either side, as for
    batches stored before digests were kept, is not compared)."""
    return first[:2] == repeat[:2] and (first[2] is None or repeat[2] is None or first[2] == repeat[2])


def conflict_reason(first: tuple, repeat: tuple) -> str:
    other = "other events" if first[:2] == repeat[:2] else f"a {repeat[0]} of {repeat[1]} events"
    return (f"conflicting repeat: this batch key was first a {first[0]} of {first[1]} events, the repeat is "
            f"{other} (a resend repeats its batch exactly)")


def _batch_keys(accepted: list[tuple[Record, Envelope]], contents: list[tuple]) -> pa.Table:
    """One row per accepted message; ``contents``: each one's ``_content`` (its checksum is computed
    once per message)."""
    return pa.table({
        MESSAGE_COLUMN: pa.array(range(len(accepted)), pa.int32()),
        "run_id": pa.array([e.run_id for _, e in accepted], pa.string()),
        "rank": pa.array([e.rank for _, e in accepted], pa.int32()),
        "stream": pa.array([e.stream.value for _, e in accepted], pa.string()),
        "session_id": pa.array([e.session_id for _, e in accepted], pa.string()),
        "seq": pa.array([e.seq for _, e in accepted], pa.int64()),
        "kind": pa.array([e.kind.value for _, e in accepted], pa.string()),
        "events": pa.array([content[1] for content in contents], pa.int64()),
        "digest": pa.array([content[2] for content in contents], pa.int64()),
        "topic": pa.array([r.topic for r, _ in accepted], pa.string()),
        "partition": pa.array([r.partition for r, _ in accepted], pa.int32()),
        "kafka_offset": pa.array([r.offset for r, _ in accepted], pa.int64()),
    })


