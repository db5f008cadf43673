"""What the materializer has stored, as it tells producers: sequence ranges per sender.

A producer keeps every message the broker acknowledged until the materializer has stored it,
because the embedded broker keeps its log in memory (a restart loses what it acknowledged). The
materializer announces, after its commits, the ranges of sequence numbers it holds for each
``(run, rank, stream, session)``; the announcement is cumulative, so one that a producer missed
is covered by the next. JSON, like the requests topic: small, and readable with any Kafka tool.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable

__all__ = ["Sender", "StoredRanges", "merge_ranges", "covered", "encode_stored", "decode_stored"]

#: ``(run_id, rank, stream, session_id)``: whose sequence numbers a range counts.
Sender = tuple[str, int, str, str]
#: Closed ranges ``(first, last)`` of sequence numbers, sorted and disjoint.
Ranges = list[tuple[int, int]]
#: An announcement carries at most this many ranges per sender (the latest ones): a sender whose
#: messages were lost has a gap, and many such gaps must not make announcements grow without bound.
MAX_RANGES = 64


@dataclass(frozen=True)
class StoredRanges:
    sender: Sender
    ranges: Ranges


def merge_ranges(ranges: Ranges, seqs: Iterable[int]) -> Ranges:
    """``ranges`` with ``seqs`` added, merged back into sorted, disjoint, non-adjacent ranges."""
    points = sorted([*ranges, *((s, s) for s in seqs)])
    merged: Ranges = []
    for first, last in points:
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def covered(ranges: Ranges, seq: int) -> bool:
    return any(first <= seq <= last for first, last in ranges)


def encode_stored(items: Iterable[StoredRanges]) -> bytes:
    return json.dumps({"kind": "stored", "senders": [
        [*item.sender, [list(r) for r in item.ranges[-MAX_RANGES:]]] for item in items]}).encode()


def decode_stored(raw: bytes | None) -> list[StoredRanges]:
    """The announcement in ``raw``; anything malformed is skipped, never raised (it only delays a
    producer's cleanup: what it keeps is resent at worst)."""
    try:
        message = json.loads(raw or b"")
        senders = message["senders"] if message.get("kind") == "stored" else []
    except (ValueError, UnicodeDecodeError, AttributeError, KeyError, TypeError):
        return []
    found = []
    for item in senders if isinstance(senders, list) else []:
        try:
            run_id, rank, stream, session_id, ranges = item
            ranges = [(int(first), int(last)) for first, last in ranges]
        except (ValueError, TypeError):
            continue
        if isinstance(run_id, str) and type(rank) is int and isinstance(stream, str) and isinstance(session_id, str):
            found.append(StoredRanges((run_id, rank, stream, session_id), ranges))
    return found
