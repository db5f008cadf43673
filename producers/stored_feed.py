"""The materializer's announcements of what it stored, as one rank's producer hears them.

Read from ``<prefix>.stored`` (``schemas.stored``) by the producer's topic tail; hands this run's and rank's ranges to the
delivery, which then lets go of the messages they cover. Any announcement, even one for other
ranks, tells the delivery the materializer is there: a closing producer waits for it longer.
"""

from __future__ import annotations

from typing import Callable

from rankstream.schemas.stored import decode_stored

__all__ = ["StoredFeed"]


class StoredFeed:
    def __init__(self, run_id: str, *, rank: int,
                 confirm: Callable[[dict[tuple[str, str], list[tuple[int, int]]]], None]) -> None:
        self._run_id, self._rank, self._confirm = run_id, rank, confirm

    def received(self, raw: bytes | None) -> None:
        self._confirm({(item.sender[2], item.sender[3]): item.ranges for item in decode_stored(raw)
                       if item.sender[0] == self._run_id and item.sender[1] == self._rank})
