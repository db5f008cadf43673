"""Delivery: gets every encoded message to the bus, or to the spool, or counts it as dropped.

Runs on the producer's sender thread. Its overflow policy, in order:

1. broker up: hand the message to the transport (at most ``max_inflight_bytes`` unacknowledged);
2. broker down or slow: keep it in memory, up to the same byte cap;
3. beyond that: append it to the spool on disk, up to the spool's cap;
4. beyond that: drop it and count it.

While the spool holds anything, new messages go to the spool too, so what was queued first is
sent first. The broker's health is a small state machine: ``DOWN`` (retry every
``retry_interval_s``), ``PROBING`` (one message, or one spool segment, in flight) and ``UP``. A
failed send drops to ``DOWN`` and the message goes to the spool; it is never retried in a loop.
Transport callbacks may arrive on another thread; they only touch counters and queues under a
lock, and all file I/O stays on the sender thread.

Broker restarts: acknowledged messages stay in a :class:`ResendWindow`. After every reconnect,
and every ``incarnation_check_s`` while up, the transport names the broker's incarnation; when it
changed, the window is submitted again. With ``confirmed`` on, the window keeps them until the
materializer announces them stored (:meth:`Delivery.confirm`), a replayed spool segment included,
and at close what is still unannounced goes back to the spool.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rankstream.producers.resend_window import IncarnationWatch, ResendWindow
from rankstream.producers.spool import Spool, SpooledMessage
from rankstream.producers.transport import Transport
from rankstream.schemas.errors import is_transient

__all__ = ["Delivery", "DeliveryCounters", "Health"]


class Health(enum.Enum):
    DOWN = "down"
    PROBING = "probing"
    UP = "up"


@dataclass(frozen=True, slots=True)
class DeliveryCounters:
    events_sent: int
    events_spooled: int
    events_dropped: int
    bytes_sent: int
    pending_bytes: int
    inflight_bytes: int
    spool_bytes: int
    health: str
    last_error: str | None
    broker_resets: int = 0
    events_resent: int = 0
    events_not_resent: int = 0
    send_failures: int = 0


#: What ``drain`` keeps of its timeout for closing the Kafka client (a 0.5 s graceful close, then up
#: to 2 s for its I/O thread to fail what it holds) and spooling the rest.
CLOSE_RESERVE_S = 3.0


#: At close, how long to wait for the materializer to announce what it stored: when it was heard
#: from in the last ``HEARD_RECENTLY_S``, and when it was not (it may be down: the rest is spooled).
CLOSE_WAIT_STORED_S = 10.0
CLOSE_WAIT_UNHEARD_S = 2.0
HEARD_RECENTLY_S = 5.0


class _SegmentReplay:
    def __init__(self, path: Path, sequences: list[tuple[str, str, int] | None]) -> None:
        self.path = path
        self.sequences = sequences
        self.outstanding = len(sequences)
        self.failed = False


class Delivery:
    def __init__(self, transport: Transport, spool: Spool, max_inflight_bytes: int,
                 *, retry_interval_s: float = 1.0, resend_window_s: float = 60.0,
                 resend_window_bytes: int = 64 << 20, incarnation_check_s: float = 2.0,
                 on_broker_reset: Callable[[], None] | None = None,
                 on_first_spool: Callable[[], None] | None = None, confirmed: bool = False) -> None:
        self._transport = transport
        self._spool = spool
        #: Called once, the first time a message goes to the spool (the user is told where it waits).
        self._on_first_spool = on_first_spool
        self._cap = max_inflight_bytes
        self._retry_interval = retry_interval_s
        self._on_broker_reset = on_broker_reset
        self._incarnation = IncarnationWatch(transport.incarnation, incarnation_check_s)
        self._window = ResendWindow(resend_window_s, resend_window_bytes,
                                    acked=spool.area("acked") if confirmed else None)
        self._window.recover(spool)
        #: When an announcement for this rank last arrived (monotonic; None: never): a close waits
        #: longer for the materializer when it is known to be there.
        self._heard_at: float | None = None
        #: Announcements received since the sender thread last applied them.
        self._announced: dict[tuple[str, str], list[tuple[int, int]]] = {}
        self._resets = self._resent = self._not_resent = 0
        self._lock = threading.Lock()
        self._health = Health.DOWN
        self._next_retry = 0.0
        self._pending: collections.deque[SpooledMessage] = collections.deque()
        self._pending_bytes = 0
        self._failed: collections.deque[SpooledMessage] = collections.deque()
        self._inflight_bytes = 0
        #: Messages handed to the transport and not yet acknowledged or failed, by send token. At
        #: close, whatever the transport never reported on is spooled from here, not lost.
        self._inflight: dict[int, tuple[SpooledMessage, _SegmentReplay | None]] = {}
        self._tokens = itertools.count()
        self._replay: _SegmentReplay | None = None
        self._sent = self._spooled = self._dropped = self._bytes_sent = self._send_failures = 0
        self._last_error: str | None = None

    # -- called on the sender thread -------------------------------------------------------
    def submit(self, message: SpooledMessage) -> None:
        size = len(message.value)
        if self._spool.has_pending() or self._replay is not None:
            self._to_spool(message)
        elif self._health is Health.UP and not self._pending and self._inflight_bytes + size <= self._cap:
            self._send(message, None)
        elif self._pending_bytes + self._inflight_bytes + size <= self._cap:
            self._pending.append(message)
            self._pending_bytes += size
        else:
            self._to_spool(message)

    def pump(self, now: float | None = None) -> None:
        """Advance the state machine: retry, replay the spool, send what waits in memory."""
        now = time.monotonic() if now is None else now
        self._drain_failed()
        self._settle_window()
        self._finish_replay()
        if self._health is Health.DOWN and now >= self._next_retry:
            self._next_retry = now + self._retry_interval
            # Start from a fresh client: after an outage the old one may be in a fatal state
            # (an idempotent producer whose broker restarted cannot recover its producer id).
            # Closing it fails what it still holds, and those messages come back via _failed.
            self._transport.close()
            self._drain_failed()
            if self._transport.connect():
                self._probe()
                self._resend_if_reset(now)
            else:
                self._last_error = getattr(self._transport, "last_error", None) or "broker unreachable"
        elif self._health is Health.UP and self._incarnation.due(now):
            self._resend_if_reset(now)
        if self._health is Health.UP:
            if self._replay is None and self._spool.has_pending():
                self._start_replay()
            while self._pending and self._inflight_bytes + len(self._pending[0].value) <= self._cap:
                message = self._pending.popleft()
                self._pending_bytes -= len(message.value)
                self._send(message, None)

    def drain(self, timeout_s: float) -> None:
        """At shutdown: deliver what is in flight and in memory; spool whatever is left.

        A broker that is down gets one more connection attempt, not the whole timeout. Delivery
        stops ``CLOSE_RESERVE_S`` early (at most a quarter of the timeout): closing the client and
        spooling what it still holds must also fit in the timeout, or the caller's process exits
        with them undone.
        """
        deadline = time.monotonic() + timeout_s - min(CLOSE_RESERVE_S, timeout_s / 4)
        self._next_retry = 0.0
        self.pump()
        while time.monotonic() < deadline and self._health is not Health.DOWN:
            if not self._pending and self._replay is None and not self._spool.has_pending():
                break
            time.sleep(0.005)
            self.pump()
        self._transport.flush(max(0.0, deadline - time.monotonic()))
        self.pump()
        self._await_stored(deadline)
        self._transport.close()  # what is still unacknowledged fails back to us, and is spooled below
        self._drain_failed()
        self._spool_unreported()
        while self._pending:
            message = self._pending.popleft()
            self._pending_bytes -= len(message.value)
            self._to_spool(message)
        with self._lock:
            unannounced = self._window.release(self._spool)
            self._not_resent += unannounced.not_resent
        for message in unannounced.messages:  # the close line names the spool; "no broker" would be wrong here
            self._to_spool(dataclasses.replace(message, resend=True), announce=False)
        self._spool.close()

    def _await_stored(self, deadline: float) -> None:
        """Confirmed mode, at close: wait for the materializer to announce what the broker
        acknowledged (the rest is spooled). Not long when it was never heard from: it may be down."""
        if not self._window.confirmed or self._health is Health.DOWN:
            return
        now = time.monotonic()
        heard = self._heard_at is not None and now - self._heard_at < HEARD_RECENTLY_S
        deadline = min(deadline, now + (CLOSE_WAIT_STORED_S if heard else CLOSE_WAIT_UNHEARD_S))
        while time.monotonic() < deadline:
            self.pump()
            if not self.unconfirmed() and not self._inflight_bytes:
                return
            time.sleep(0.02)

    def counters(self) -> DeliveryCounters:
        with self._lock:
            return DeliveryCounters(
                events_sent=self._sent,
                events_spooled=self._spooled,
                events_dropped=self._dropped,
                bytes_sent=self._bytes_sent,
                pending_bytes=self._pending_bytes,
                inflight_bytes=self._inflight_bytes,
                spool_bytes=self._spool.bytes,
                health=self._health.value,
                # both, when the broker is down AND the spool cannot take what it would have held
                last_error="; ".join(e for e in (self._last_error, self._spool.last_error) if e) or None,
                broker_resets=self._resets,
                events_resent=self._resent,
                events_not_resent=self._not_resent,
                send_failures=self._send_failures,
            )

    def refusing(self) -> bool:
        """True when whatever is submitted next would go to a spool too full to take it (a spool
        that holds anything takes every new message, to keep their order), and be dropped: the
        caller drops it before spending CPU on encoding it."""
        return self._spool.has_pending() and self._spool.would_refuse()

    def count_dropped(self, events: int) -> None:
        with self._lock:
            self._dropped += events

    def confirm(self, stored: dict[tuple[str, str], list[tuple[int, int]]]) -> None:
        """The materializer's announcement for this rank: ``(stream, session_id)`` to the ranges
        of sequence numbers it stored. Any thread; the sender thread applies it at its next pump."""
        with self._lock:
            self._announced.update(stored)
            self._heard_at = time.monotonic()

    def unconfirmed(self) -> int:
        """Acknowledged messages not yet announced as stored."""
        with self._lock:
            return self._window.unconfirmed()

    def note_error(self, message: str) -> None:
        """Keep ``message`` as the last error: a problem of the data rather than of the broker."""
        with self._lock:
            self._last_error = message[:300]

    # -- broker incarnations -----------------------------------------------------------------
    def _resend_if_reset(self, now: float) -> None:
        """When the broker lost what it had acknowledged, submit the resend window again."""
        if not self._incarnation.changed(now):
            return
        with self._lock:
            taken = self._window.take(now, self._spool)
            messages = taken.messages
            self._not_resent += taken.not_resent
            self._resets += 1
            self._resent += sum(message.events for message in messages)
            self._last_error = (f"the broker restarted and lost its log; resending {len(messages)} "
                                "acknowledged messages")
        for message in messages:
            self.submit(dataclasses.replace(message, resend=True))
        if self._on_broker_reset is not None:
            self._on_broker_reset()

    # -- internals --------------------------------------------------------------------------
    def _settle_window(self) -> None:
        """Apply the announcements received, and move what is over the window's memory cap to
        disk. Under the lock, so the Kafka thread's acknowledgements wait for the file writes:
        they happen only while the materializer is behind."""
        with self._lock:
            announced, self._announced = self._announced, {}
            if announced:
                self._window.confirm(announced)
            self._window.spill()

    def _probe(self) -> None:
        if self._spool.has_pending():
            self._health = Health.PROBING
            self._start_replay()
        elif self._pending:
            self._health = Health.PROBING
            message = self._pending.popleft()
            self._pending_bytes -= len(message.value)
            self._send(message, None)
        else:
            self._health = Health.UP

    def _start_replay(self) -> None:
        path = self._spool.oldest_segment()
        if path is None:
            return
        messages = list(self._spool.read_segment(path))
        if not messages:
            self._spool.remove_segment(path)
            return
        replay = _SegmentReplay(path, [message.sequence for message in messages])
        self._replay = replay
        for message in messages:
            self._send(message, replay)

    def _finish_replay(self) -> None:
        replay = self._replay
        if replay is None or replay.outstanding > 0:
            return
        self._replay = None
        if replay.failed:
            return  # the segment stays; it is resent whole later and the materializer dedups
        with self._lock:
            self._window.adopt_segment(replay.path, self._spool, replay.sequences)

    def _send(self, message: SpooledMessage, replay: _SegmentReplay | None) -> None:
        token = next(self._tokens)
        with self._lock:
            self._inflight_bytes += len(message.value)
            self._inflight[token] = (message, replay)
        try:
            self._transport.send(message.topic, message.key, message.value,
                                 done=lambda error: self._on_done(token, error))
        except Exception as exc:  # the transport refused synchronously (buffer full, not connected)
            self._on_done(token, exc)

    def _spool_unreported(self) -> None:
        """At close: messages the transport neither acknowledged nor failed (kafka-python fails a
        force-closed producer's batches later, on its own thread, if at all) go to the spool; a
        replayed segment stays on disk whole. A late report on them is ignored."""
        with self._lock:
            unreported, self._inflight = list(self._inflight.values()), {}
            self._inflight_bytes = 0
        for message, replay in unreported:
            if replay is None:
                self._to_spool(message)
            else:
                replay.failed = True

    def _on_done(self, token: int, error) -> None:
        with self._lock:
            entry = self._inflight.pop(token, None)
            if entry is None:
                return  # already spooled at close
            message, replay = entry
            self._inflight_bytes -= len(message.value)
            if error is None:
                if not message.resend:
                    self._sent += message.events
                self._bytes_sent += len(message.value)
                if replay is None or not self._window.confirmed:  # a confirmed replay is kept by its segment
                    self._window.remember(message, time.monotonic())
                if self._health is Health.PROBING and replay is None:
                    self._health = Health.UP
            elif not is_transient(error):  # the broker refused this message for good (too large...)
                self._last_error = f"refused, dropped: {type(error).__name__}: {error}"[:300]
                self._dropped += message.events
                error = None  # resending cannot help: a replayed segment may still be removed
            else:
                self._send_failures += 1
                self._last_error = f"{type(error).__name__}: {error}"[:300]
                self._health = Health.DOWN
                if replay is None:
                    self._failed.append(message)
            if replay is not None:
                replay.outstanding -= 1
                replay.failed = replay.failed or error is not None
                if replay.outstanding == 0 and not replay.failed and self._health is Health.PROBING:
                    self._health = Health.UP

    def _drain_failed(self) -> None:
        while self._failed:
            with self._lock:
                message = self._failed.popleft()
            self._to_spool(message)

    def _to_spool(self, message: SpooledMessage, announce: bool = True) -> None:
        if self._spool.append(message):
            with self._lock:
                self._spooled += message.events
            if announce and self._on_first_spool is not None:
                announce, self._on_first_spool = self._on_first_spool, None
                announce()
        else:
            with self._lock:
                self._dropped += message.events
