"""The producer's sender thread: everything the training thread does not do.

It cuts the queued rows into batches of ``batch_events`` (or every ``flush_interval_s``), encodes
them, sends the control messages and heartbeats, and pumps the delivery (Kafka, the spool, or a
counted drop). ``Producer`` runs it on its own daemon thread; the training-thread side is in
``producers.producer``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rankstream.producers.row_queue import columns_of, rows_of
from rankstream.producers.spool import SpooledMessage
from rankstream.schemas.codec import MAX_MESSAGE_BYTES, encode_wire
from rankstream.schemas.envelope import PayloadKind
from rankstream.schemas.records import HEARTBEAT_COUNTERS, FrBatch, Heartbeat, InputRejects, PgConfig, RankMeta
from rankstream.schemas.fields import PayloadError
from rankstream.schemas.trace import TraceBatch, row_problem

__all__ = ["SenderLoop"]

#: How often the sender thread wakes, as a fraction of the flush interval. Each wake takes the GIL
#: from the training thread (which can then wait up to the interpreter's 5 ms switch interval),
#: so it wakes rarely and cuts every full batch at once.
_TICKS_PER_FLUSH = 2


class SenderLoop:
    """The sender thread's half of :class:`~rankstream.producers.producer.Producer` (it shares the
    producer's queues and delivery)."""

    def _run(self) -> None:
        settings = self._config.producer
        last_cut = last_heartbeat = time.monotonic()
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                flush = self._flush_requested.is_set()
                due = flush or now - last_cut >= settings.flush_interval_s
                if len(self._rows) >= settings.batch_events or (due and self._rows):
                    self._cut_trace_batches(whole=due)
                    last_cut = now
                elif due:
                    last_cut = now
                self._send_control()
                if now - last_heartbeat >= settings.heartbeat_interval_s:
                    self._send_heartbeat(final=False)
                    last_heartbeat = now
                self._delivery.pump(now)
                if flush:
                    self._wait_delivered(5.0)
                self._refusing = self._delivery.refusing()  # set before a flush is reported done
                if flush:
                    self._flush_requested.clear()
                    self._flushed.set()
                if len(self._rows) < settings.batch_events:
                    self._stopping.wait(settings.flush_interval_s / _TICKS_PER_FLUSH)
            self._shutdown()
        except Exception as exc:  # never let the sender thread die silently
            self._delivery.count_dropped(self._rows.clear())
            print(f"rankstream: producer sender thread stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            self._flushed.set()
            self._stopped.set()

    def _wait_delivered(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._delivery.pump()
            counters = self._delivery.counters()
            if counters.pending_bytes == 0 and counters.inflight_bytes == 0 and counters.spool_bytes == 0:
                return
            if counters.health == "down":
                return
            time.sleep(0.002)

    def _shutdown(self) -> None:
        self._cut_trace_batches(whole=True)
        self._send_control()
        self._send_heartbeat(final=True)
        self._delivery.drain(timeout_s=self._close_timeout)
        self._transport.close()

    def _cut_trace_batches(self, whole: bool) -> None:
        """Take full batches (and, if ``whole``, the remainder) and encode them: only the rows
        queued when it starts, so a training thread that keeps the queue full cannot keep the
        sender here and away from pumping the delivery (retries, the resend window's cap)."""
        size = self._config.producer.batch_events
        queued = len(self._rows)
        count = queued if whole else queued - queued % size
        if count == 0:
            return
        columns = self._rows.take(count)
        self._emitted += count
        for start in range(0, count, size):
            part = {name: column[start:start + size] for name, column in columns.items()}
            if self._delivery.refusing():
                self._delivery.count_dropped(len(part["ph"]))
            else:
                self._send_trace_columns(part)

    def _send_trace_columns(self, columns: dict[str, list]) -> None:
        count = len(columns["ph"])
        try:
            batch = TraceBatch.from_columns(columns)
            batch.check_values()
        except (ValueError, PayloadError):  # some events hold values their columns cannot: drop just those
            rows = self._drop_invalid(rows_of(columns))
            if not rows:
                return
            columns, count = columns_of(rows), len(rows)  # the rest, also when halved below
            batch = TraceBatch.from_columns(columns)
        except Exception as exc:  # anything else the encoder meets costs this batch, never the thread
            self._delivery.count_dropped(count)
            self._delivery.note_error(f"a batch of {count} events dropped: {type(exc).__name__}: {exc}")
            return
        try:
            self._submit(PayloadKind.TRACE_BATCH, batch.to_wire(), count)
        except _TooLarge:
            if count == 1:
                self._delivery.count_dropped(1)
                return
            half = count // 2
            self._send_trace_columns({name: column[:half] for name, column in columns.items()})
            self._send_trace_columns({name: column[half:] for name, column in columns.items()})
        except Exception:  # a value the encoder cannot take: drop this batch, keep going
            self._delivery.count_dropped(count)

    def _drop_invalid(self, rows: list[tuple]) -> list[tuple]:
        """The rows that fit their columns; the others are counted as dropped, the first one's
        problem kept as the producer's last error (``status`` shows both)."""
        kept = []
        for row in rows:
            problem = row_problem(row)
            if problem is None:
                kept.append(row)
            else:
                self._delivery.count_dropped(1)
                self._delivery.note_error(f"event {str(row[0])[:80]!r} dropped: {problem}")
        return kept

    def _send_batch(self, batch: TraceBatch) -> None:
        self._batch_events_taken += batch.count
        self._emitted += batch.count
        if self._delivery.refusing():
            self._delivery.count_dropped(batch.count)
            return
        try:
            self._submit(PayloadKind.TRACE_BATCH, batch.to_wire(), batch.count)
        except Exception:  # above the message cap: the importer that built it cuts by size
            self._delivery.count_dropped(batch.count)

    def _announce_again(self) -> None:
        """After a broker restart, send who this rank is and its groups again: the resend window
        may no longer hold them, and without them the run's other rows have no context."""
        self._control.append((PayloadKind.RANK_META, {}))
        if self._groups is not None:
            self._control.append((PayloadKind.PG_CONFIG, self._groups))

    def _send_control(self) -> None:
        while self._control:
            kind, data = self._control.popleft()
            if kind is PayloadKind.TRACE_BATCH:
                self._send_batch(data)
                continue
            if kind is PayloadKind.FR_BATCH and self._delivery.refusing():
                continue  # the spool would drop them: do not encode them
            try:
                if kind is PayloadKind.FR_BATCH:
                    entries, snapshot_ns = data
                    wire = FrBatch(snapshot_ns=snapshot_ns, entries=entries).to_wire()
                elif kind is PayloadKind.INPUT_REJECTS:
                    wire = InputRejects(rows=data).to_wire()
                elif kind is PayloadKind.PG_CONFIG:
                    wire = PgConfig(groups=data).to_wire()
                    self._groups = data
                else:  # RANK_META: merge the update into what was sent before
                    self._rank_meta.update(data)
                    wire = RankMeta(fields=dict(self._rank_meta)).to_wire()
                self._submit(kind, wire, 0)
            except Exception as exc:  # malformed user data: named in the last error, which `status` shows
                self._delivery.note_error(f"a {kind.name} message dropped: {type(exc).__name__}: {exc}")

    def _send_heartbeat(self, final: bool) -> None:
        stats = self.stats()
        wire = Heartbeat(fields={
            **{name: getattr(stats, name) for name in HEARTBEAT_COUNTERS},
            "final": final,
            "collectives": self._collectives,
            "collectives_read_ns": self._collectives_read_ns,
        }).to_wire()
        self._submit(PayloadKind.HEARTBEAT, wire, 0)

    def _submit(self, kind: PayloadKind, wire: Any, events: int) -> None:
        stream = kind.stream
        value = encode_wire(run_id=self.run_id, rank=self.rank, world_size=self.world_size,
                            session_id=self.session_id, seq=self._seq[stream], kind=kind, wire_payload=wire)
        if len(value) > MAX_MESSAGE_BYTES:
            raise _TooLarge()
        sequence = (stream.value, self.session_id, self._seq[stream])
        self._seq[stream] += 1
        self._delivery.submit(SpooledMessage(self._topics[stream], self._key, value, events, sequence=sequence))


class _TooLarge(Exception):
    """An encoded batch above the message cap; the caller splits it."""
