"""The trace events ``Producer.emit`` queues, flattened into one list.

Each event is ``ROW_WIDTH`` consecutive items in ``TRACE_ROW_FIELDS`` order. The training thread
adds one with a single ``list.extend`` of a tuple, which runs in C under the GIL, so the sender
thread never sees half an event and neither side takes a lock. The sender takes whole batches
and turns them into columns with strided slices (``items[i::ROW_WIDTH]``), which copy pointers in
C: transposing a queue of row tuples with ``zip(*rows)`` cost the sender more CPU than all the
encoding after it (docs/benchmarks.md, "Ingest").
"""

from __future__ import annotations

from typing import Any

from rankstream.schemas.trace import TRACE_ROW_FIELDS

__all__ = ["ROW_WIDTH", "RowQueue", "rows_of", "columns_of"]

ROW_WIDTH = len(TRACE_ROW_FIELDS)


class RowQueue:
    """A bounded queue of trace rows. ``items`` is the flat list ``emit`` extends, and ``limit``
    its bound in items; both are read once into locals by the caller on the hot path."""

    __slots__ = ("items", "limit")

    def __init__(self, max_events: int) -> None:
        self.items: list[Any] = []
        self.limit = max_events * ROW_WIDTH

    def __len__(self) -> int:
        return len(self.items) // ROW_WIDTH

    def take(self, events: int) -> dict[str, list]:
        """Remove the oldest ``events`` rows and return them as columns named as
        ``TRACE_ROW_FIELDS``. The training thread may extend the list meanwhile: it only adds at
        the end, past what is taken."""
        end = events * ROW_WIDTH
        columns = {name: self.items[index:end:ROW_WIDTH] for index, name in enumerate(TRACE_ROW_FIELDS)}
        del self.items[:end]
        return columns

    def clear(self) -> int:
        """Drop every queued row; returns how many there were."""
        count = len(self)
        del self.items[:count * ROW_WIDTH]
        return count


def rows_of(columns: dict[str, list]) -> list[tuple]:
    """Columns (as ``RowQueue.take`` returns them) back to row tuples, for the rare path that
    checks events one by one."""
    return list(zip(*(columns[name] for name in TRACE_ROW_FIELDS)))


def columns_of(rows: list[tuple]) -> dict[str, list]:
    """Row tuples as columns named as ``TRACE_ROW_FIELDS`` (the inverse of ``rows_of``)."""
    return {name: list(values) for name, values in zip(TRACE_ROW_FIELDS, zip(*rows))}
