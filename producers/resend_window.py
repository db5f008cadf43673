"""The resend window: acknowledged messages kept for a broker that comes back without its log.

An acknowledged message is safe only while the broker keeps its log, and the embedded broker
keeps it in memory. So :class:`~rankstream.producers.delivery.Delivery` remembers what was
acknowledged in the last ``seconds`` (at most ``max_bytes`` of it) and, when the broker's
incarnation changes, takes the whole window back to submit again; the materializer drops
whatever it already had, by batch key. Messages acknowledged within the window's time but
already pushed out by its byte cap cannot be resent: they are counted as ``not_resent``.

Not thread-safe on its own: Delivery calls it under its lock.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable

from rankstream.producers.spool import SpooledMessage

__all__ = ["ResendWindow", "Taken", "IncarnationWatch"]


@dataclass(frozen=True)
class Taken:
    """What :meth:`ResendWindow.take` returns: the messages to resend, and the events that were
    acknowledged within the window's time but could not be kept."""

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
    def __init__(self, seconds: float, max_bytes: int) -> None:
        self._seconds = seconds
        self._max_bytes = max_bytes
        #: Acknowledged messages, oldest first, with when they were acknowledged.
        self._kept: collections.deque[tuple[float, SpooledMessage]] = collections.deque()
        self._bytes = 0
        #: (acknowledged at, events) of messages the byte cap pushed out.
        self._evicted: collections.deque[tuple[float, int]] = collections.deque()

    def remember(self, message: SpooledMessage, now: float) -> None:
        """Keep an acknowledged message, forgetting what is older than the window or over its cap."""
        self._kept.append((now, message))
        self._bytes += len(message.value)
        while self._kept and (self._bytes > self._max_bytes or now - self._kept[0][0] > self._seconds):
            acked, old = self._kept.popleft()
            self._bytes -= len(old.value)
            if now - acked <= self._seconds:
                self._evicted.append((acked, old.events))
        while self._evicted and now - self._evicted[0][0] > self._seconds:
            self._evicted.popleft()

    def take(self, now: float) -> Taken:
        """Empty the window: everything it kept, and the count of what it could not."""
        taken = Taken(messages=[message for _, message in self._kept],
                      not_resent=sum(events for acked, events in self._evicted if now - acked <= self._seconds))
        self._kept.clear()
        self._evicted.clear()
        self._bytes = 0
        return taken
