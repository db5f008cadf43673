"""The resend window: acknowledged messages kept until they are known to be safe.

An acknowledged message is safe only once the materializer stored it: the embedded broker keeps
its log in memory, so a restart loses what it acknowledged. :class:`~rankstream.producers.delivery.Delivery`
hands every acknowledged message to the window, and takes the whole window back to submit again
when the broker's incarnation changes (the materializer drops what it already had, by batch key).

Two modes:

- **confirmed** (a producer that reads the materializer's announcements, ``schemas.stored``): a
  message stays until an announcement covers its sequence number. Past ``max_bytes`` in memory,
  the oldest go to an ``acked/`` spool area on disk, and so do spool segments that were replayed
  (a segment is deleted only once every message in it is announced). At close, what is still
  unconfirmed goes back to the spool, for ``up``, ``flush`` or the rank's next process to send.
- **timed** (no announcements, as for in-memory tests): the last ``seconds`` of acknowledged
  messages, at most ``max_bytes``; nothing is kept at close.

Whatever had to be let go although it might be needed (past the caps) is counted as
``not_resent``. Not thread-safe on its own: Delivery calls it under its lock.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rankstream.producers.spool import Spool, SpooledMessage, abandoned
from rankstream.schemas.stored import Ranges, covered

__all__ = ["ResendWindow", "Taken", "IncarnationWatch"]

#: ``(stream, session_id)``: whose sequence numbers one announcement's ranges count.
_Sender = tuple[str, str]


@dataclass
class Taken:
    """What :meth:`ResendWindow.take` returns: the messages to send again, and the events that
    were acknowledged but could not be kept."""

    messages: list[SpooledMessage]
    not_resent: int


class IncarnationWatch:
    """Asks the transport which broker incarnation it talks to, every ``every_s`` while up and
    after every reconnect, and says when it changed: the broker lost everything it acknowledged."""

    def __init__(self, incarnation: Callable[[], str | None], every_s: float) -> None:
        self._incarnation = incarnation
        self._every_s = every_s
        self._next_check = 0.0
        self._last: str | None = None

    def due(self, now: float) -> bool:
        return now >= self._next_check

    def changed(self, now: float) -> bool:
        self._next_check = now + self._every_s
        current = self._incarnation()
        if current is None:
            return False
        previous, self._last = self._last, current
        return previous is not None and current != previous


class ResendWindow:
    def __init__(self, seconds: float, max_bytes: int, *, acked: Spool | None = None) -> None:
        """``acked`` (the spool's ``acked/`` area) turns on the confirmed mode."""
        self._seconds = seconds
        self._max_bytes = max_bytes
        self._acked = acked
        #: Acknowledged messages, oldest first, with when they were acknowledged.
        self._kept: collections.deque[tuple[float, SpooledMessage]] = collections.deque()
        self._bytes = 0
        #: (acknowledged at, events) of messages the byte cap pushed out (timed mode).
        self._evicted: collections.deque[tuple[float, int]] = collections.deque()
        self._not_resent_since_take = 0
        #: Segments in the acked area, with the sequences in them not yet announced.
        self._segments: dict[Path, set[tuple[str, str, int]]] = {}
        #: The latest announced ranges per sender of this run and rank.
        self._stored: dict[_Sender, Ranges] = {}

    @property
    def confirmed(self) -> bool:
        return self._acked is not None

    def unconfirmed(self) -> int:
        """Messages (in memory and in acked segments) not yet announced as stored."""
        return len(self._kept) + sum(len(sequences) for sequences in self._segments.values())

    def remember(self, message: SpooledMessage, now: float) -> None:
        """Keep an acknowledged message (timed mode: forgetting what is older than the window or
        over its cap). Memory only: it runs on the Kafka client's thread."""
        if self._is_stored(message.sequence):
            return
        self._kept.append((now, message))
        self._bytes += len(message.value)
        if self.confirmed:
            return  # past the cap, :meth:`spill` moves the oldest to disk, on the sender thread
        while self._kept and (self._bytes > self._max_bytes or now - self._kept[0][0] > self._seconds):
            acked, old = self._kept.popleft()
            self._bytes -= len(old.value)
            if now - acked <= self._seconds:
                self._evicted.append((acked, old.events))
        while self._evicted and now - self._evicted[0][0] > self._seconds:
            self._evicted.popleft()

    def spill(self) -> None:
        """Confirmed mode: move the oldest messages past the memory cap to the acked area."""
        while self.confirmed and self._kept and self._bytes > self._max_bytes:
            _, old = self._kept.popleft()
            self._bytes -= len(old.value)
            self._to_disk(old)

    def adopt_segment(self, path: Path, spool: Spool, sequences: list[tuple[str, str, int] | None]) -> None:
        """A spool segment whose messages were all acknowledged: deleted if all are announced
        already, else moved to the acked area until they are (timed mode: deleted)."""
        waiting = {s for s in sequences if s is not None and not self._is_stored(s)}
        if not self.confirmed or (not waiting and None not in sequences):
            spool.remove_segment(path)
            return
        moved = spool.move_segment(path, self._acked)
        if moved is not None:
            self._segments[moved] = waiting

    def confirm(self, stored: dict[_Sender, Ranges]) -> None:
        """An announcement: forget every message it covers, deleting acked segments left empty."""
        self._stored.update(stored)
        kept = [(acked, m) for acked, m in self._kept if not self._is_stored(m.sequence)]
        self._bytes = sum(len(m.value) for _, m in kept)
        self._kept = collections.deque(kept)
        for path, waiting in list(self._segments.items()):
            waiting.difference_update({s for s in waiting if self._is_stored(s)})
            if not waiting:
                self._acked.remove_segment(path)
                del self._segments[path]

    def take(self, now: float, spool: Spool) -> Taken:
        """Empty the window, for a broker that lost its log: the messages to send again (the acked
        segments go back into ``spool``, which sends them next), and the count of what could not be kept."""
        taken = Taken(messages=[message for _, message in self._kept],
                      not_resent=self._not_resent_since_take
                      + sum(events for acked, events in self._evicted if now - acked <= self._seconds))
        self._kept.clear()
        self._evicted.clear()
        self._bytes = 0
        self._not_resent_since_take = 0
        for path in self._segments:
            self._acked.move_segment(path, spool)
        self._segments.clear()
        return taken

    def release(self, spool: Spool) -> Taken:
        """At close (confirmed mode): what is still unannounced goes back into ``spool``, segments
        by a rename; the messages in memory are returned for the caller to spool, with the count
        of those the acked area had no room for (the caller counts both)."""
        if not self.confirmed:
            return Taken(messages=[], not_resent=0)
        return self.take(0.0, spool)

    def recover(self, spool: Spool) -> None:
        """At start: acked segments whose writer process is gone go back into ``spool``, to be sent
        again (their writer could not learn whether they were stored)."""
        if self._acked is not None:
            for path in abandoned(self._acked):
                self._acked.move_segment(path, spool)

    def _to_disk(self, message: SpooledMessage) -> None:
        if not self._acked.append(message):
            self._not_resent_since_take += message.events
            return
        self._segments.setdefault(self._acked.current_segment, set()).add(message.sequence)

    def _is_stored(self, sequence: tuple[str, str, int] | None) -> bool:
        if sequence is None:
            return False
        ranges = self._stored.get(sequence[:2])
        return ranges is not None and covered(ranges, sequence[2])
