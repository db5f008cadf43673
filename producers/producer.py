"""The rank-side producer: what a training process calls to put events on the bus.

Guarantees, each tested:

* constructing a Producer opens no connection and starts one daemon thread;
* ``emit`` and the other ``emit_*`` calls only append to an in-memory queue (one ``list.extend``
  or ``deque.append``, atomic under the GIL, so the training thread takes no lock) and return in
  well under a microsecond; they never raise and never block;
* the queue is bounded (``max_buffered_events``); events beyond it are dropped and counted;
* everything else (cutting batches of ``batch_events`` or every ``flush_interval_s``, encoding,
  sending, spooling, heartbeats) happens on the sender thread;
* ``enabled=False`` turns every call into a no-op;
* ``close()`` delivers what is buffered within ``close_timeout_s`` and then returns, whatever the
  broker does.

Extending one flat list by a row tuple per event is cheaper on the training thread than appending
to eleven column lists; the sender thread slices it into columns (``producers.row_queue``).
"""

from __future__ import annotations

import collections
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from rankstream.schemas.config import Config, ProducerSettings
from rankstream.schemas.settings import load_config
from rankstream.producers.delivery import Delivery
from rankstream.producers.row_queue import RowQueue
from rankstream.producers.sender import SenderLoop
from rankstream.producers.spool import Spool
from rankstream.producers.stored_feed import StoredFeed
from rankstream.producers.topic_tail import TopicTail
from rankstream.producers.transport import KafkaTransport, Transport
from rankstream.schemas.envelope import PayloadKind, Stream
from rankstream.schemas.topics import message_key, stored_topic, topic_for
from rankstream.schemas.trace import TraceBatch

__all__ = ["Producer", "ProducerStats"]



@dataclass(frozen=True, slots=True)
class ProducerStats:
    """Counters of one producer. ``events_*`` count trace events; control messages are not events.

    Every emitted event is, or will be, sent, spooled or dropped: ``events_emitted`` counts the
    events taken in (queued, or refused at once while the spool refuses, which the sender would
    have dropped). ``events_dropped`` counts every lost event: dropped by the delivery, refused,
    and those turned away because the queue was full, which were never taken in and so are not
    in ``events_emitted``."""

    events_emitted: int
    events_sent: int
    events_spooled: int
    events_dropped: int
    bytes_sent: int
    buffered_events: int
    spool_bytes: int
    broker: str
    last_error: str | None
    #: Broker restarts this producer noticed, events it resent after them, and events it could
    #: not resend (pushed out of the resend window by its byte cap).
    broker_resets: int = 0
    events_resent: int = 0
    events_not_resent: int = 0
    #: Sends the broker failed transiently (each message was kept, spooled or resent: not lost),
    #: and profiler windows lost (dropped while the converter was behind, or failed).
    send_failures: int = 0
    windows_lost: int = 0
    #: Point-to-point calls the job returned from (``producers.transfer_count``).
    transfers: int = 0


_EMIT_CALLS = ("emit", "emit_batch", "offer_batch", "emit_fr_entries", "emit_process_groups", "emit_rank_metadata",
               "emit_input_rejects", "set_collectives")


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


class Producer(SenderLoop):
    """Streams one rank's trace events, Flight Recorder entries and metadata to the bus.

    ``transport`` replaces Kafka (tests pass an in-memory one); by default the configured Kafka
    cluster or the embedded broker is used. ``confirm_stored`` (on with Kafka) keeps every
    acknowledged message until the materializer announces it stored, and spools the rest at close.
    """

    def __init__(self, *, run_id: str, rank: int, world_size: int, config: Config | None = None,
                 enabled: bool = True, metadata: Mapping[str, Any] | None = None,
                 transport: Transport | None = None,
                 session_id: str | None = None, confirm_stored: bool | None = None) -> None:
        self.run_id = run_id
        self.rank = rank
        self.world_size = world_size
        self.enabled = enabled
        #: New per process; an importer passes one derived from its input, so importing the
        #: same file twice produces the same batch keys and the materializer drops the repeat.
        self.session_id = session_id or uuid.uuid4().hex[:16]
        self._emitted = 0
        if not enabled:
            for name in _EMIT_CALLS + ("flush", "close", "follow", "count_transfer"):
                setattr(self, name, _noop)
            return
        self._config = config or load_config()
        settings = self._config.producer
        self._rows = RowQueue(settings.max_buffered_events)
        self._row_items, self._row_items_limit = self._rows.items, self._rows.limit
        self._max_rows = settings.max_buffered_events
        self._dropped_on_emit = 0
        self._windows_lost = 0
        self._transfers = 0
        #: Set by the sender thread while ``refusing``: ``emit`` and ``offer_batch`` then count the
        #: event as emitted and dropped and return at once, instead of queueing what the sender
        #: would drop (a whole run with the broker down cost the training thread ~1 us per event).
        self._refusing = False
        self._refused_on_emit = 0
        #: Events of ``emit_batch`` batches: queued (caller's thread) and taken (sender thread).
        self._batch_events_queued = self._batch_events_taken = 0
        self._control: collections.deque[tuple[PayloadKind, Any]] = collections.deque()
        self._collectives: dict[str, Any] | None = None
        self._collectives_read_ns: int | None = None
        self._seq = {stream: 0 for stream in Stream}
        self._key = message_key(run_id, rank)
        self._topics = {stream: topic_for(self._config.topic_prefix, stream) for stream in Stream}
        if confirm_stored is None:
            confirm_stored = transport is None
        if transport is None:
            transport = KafkaTransport(self._config)
        spool = Spool(self._config.spool_dir, run_id, rank, max_bytes=settings.spool_max_bytes)
        self._groups: list | None = None
        self._delivery = Delivery(transport, spool, settings.max_inflight_bytes,
                                  resend_window_s=settings.resend_window_s,
                                  resend_window_bytes=settings.resend_window_bytes,
                                  incarnation_check_s=settings.broker_check_s,
                                  on_broker_reset=self._announce_again, on_first_spool=self._say_spooling,
                                  confirmed=confirm_stored)
        self._tail: TopicTail | None = None
        if confirm_stored:
            self.follow(stored_topic(self._config.topic_prefix),
                        StoredFeed(run_id, rank=rank, confirm=self._delivery.confirm).received)
        self._spool_directory = spool.directory
        self._transport = transport
        self._flush_requested = threading.Event()
        self._flushed = threading.Event()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._closed = False
        self._rank_meta = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at_ns": time.time_ns(),
            "metadata": dict(metadata) if metadata else None,
        }
        self._control.append((PayloadKind.RANK_META, dict(self._rank_meta)))
        self._thread = threading.Thread(target=self._run, name=f"rankstream-sender-r{rank}", daemon=True)
        self._thread.start()

    # -- training-thread API: append only ----------------------------------------------------
    def emit(self, name: str, cat: str = "", ph: str = "X", *, ts_ns: int = 0, dur_ns: int = 0,
             pid: int = 0, tid: int = 0, step: int | None = None, flow_id: int | None = None,
             correlation_id: int | None = None, args: Mapping[str, Any] | None = None) -> None:
        """Queue one trace event (Chrome trace semantics, nanosecond times). Never blocks or raises."""
        if self._refusing:
            self._refused_on_emit += 1
            return
        if args is not None and type(args) is not str:
            # Packed as one flat tuple, keys then values (a snapshot of the mapping). A tuple that
            # holds a dict is never untracked by the garbage collector, so rows waiting in the queue
            # were promoted to the oldest generation and set off full collections: ~170 ms pauses on
            # a torch process, about every 8 s at 6,400 counter events/s. A flat tuple of atoms is
            # untracked at its first collection (nested tuples are not, being built outer first).
            try:
                args = (*args, *args.values())
            except Exception:
                pass  # not a mapping: the encoder names what it cannot take
        items = self._row_items
        if len(items) < self._row_items_limit:
            items.extend((name, cat, ph, ts_ns, dur_ns, pid, tid, step, flow_id, correlation_id, args))
        else:
            self._dropped_on_emit += 1

    def emit_batch(self, batch: TraceBatch) -> None:
        """Queue a batch of trace events already in wire layout. For importers, which build
        batches from whole columns far faster than one ``emit`` per event. Nothing bounds it: the
        caller waits while ``stats().buffered_events`` is high (live code uses ``offer_batch``)."""
        self._batch_events_queued += batch.count
        self._control.append((PayloadKind.TRACE_BATCH, batch))

    def offer_batch(self, batch: TraceBatch) -> bool:
        """``emit_batch`` within the buffer bound that ``emit`` keeps: a batch that does not fit
        under ``max_buffered_events`` is dropped and counted. For live producers such as the
        profiler stream, which must not wait."""
        if self._refusing:
            self._refused_on_emit += batch.count
            return False
        if len(self._rows) + self._batches_waiting() + batch.count > self._max_rows:
            self._dropped_on_emit += batch.count
            return False
        self.emit_batch(batch)
        return True

    def emit_fr_entries(self, entries: Iterable[Mapping[str, Any]], snapshot_ns: int | None = None) -> None:
        """Queue Flight Recorder entries already in rankstream's field names (see schemas.records)."""
        self._control.append((PayloadKind.FR_BATCH, (list(entries), snapshot_ns or time.time_ns())))

    def emit_input_rejects(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Queue the items of an imported file that failed validation (see ``schemas.records.InputRejects``)."""
        self._control.append((PayloadKind.INPUT_REJECTS, [dict(r) for r in rows]))

    def emit_process_groups(self, groups: Iterable[Mapping[str, Any]]) -> None:
        """Queue the process groups this rank knows (``pg_name``, ``pg_desc``, ``ranks``, ``backend``)."""
        self._control.append((PayloadKind.PG_CONFIG, [dict(g) for g in groups]))

    def emit_rank_metadata(self, **fields: Any) -> None:
        """Update and re-send rank metadata (versions, local rank, a new clock-sync sample...)."""
        self._control.append((PayloadKind.RANK_META, fields))

    def set_collectives(self, status: Mapping[str, Any], read_ns: int | None = None) -> None:
        """The last enqueued/started/completed collective per group, carried by the next heartbeats,
        with when it was read (now by default): the live diagnosis knows the rank's ring held no
        later call at that moment, even when no new dump was taken since."""
        self._collectives = dict(status)
        self._collectives_read_ns = time.time_ns() if read_ns is None else read_ns

    @property
    def transfers(self) -> int:
        """Point-to-point calls of the job that returned so far (``count_transfer``)."""
        return self._transfers if self.enabled else 0

    def count_transfer(self) -> None:
        """One point-to-point call of the job returned (``producers.transfer_count``): carried by
        the heartbeats, the sign that a pipeline moving only by transfers is moving."""
        self._transfers += 1

    def count_lost_window(self, reason: str) -> None:
        """A profiler window was lost (its events never reached the producer): counted in the
        heartbeats, so ``status`` shows it, and kept as the last error. Never raises."""
        self._windows_lost += 1
        if self.enabled:
            self._delivery.note_error(f"profiler window lost: {reason}")

    def follow(self, topic: str, handler) -> None:
        """Hand ``topic``'s messages from now on to ``handler``, on the one thread and Kafka
        consumer that all of this producer's followed topics share (``producers.topic_tail``)."""
        if self._tail is None:
            self._tail = TopicTail(self._config, name=f"rankstream-tail-r{self.rank}")
        self._tail.follow(topic, handler)

    @property
    def refusing(self) -> bool:
        """True while whatever is emitted would be dropped (the broker is down and the spool is as
        full as when it last refused a message): callers with costly work to produce, such as the
        Flight Recorder tap's dumps, skip it until this clears. The sender thread's view, as of its
        last tick (``flush`` returns after one): what ``emit`` goes by."""
        return self.enabled and self._refusing

    @property
    def batch_events(self) -> int:
        """Events per trace message (``producer.batch_events``), for callers that cut batches."""
        return self._config.producer.batch_events if self.enabled else ProducerSettings().batch_events

    # -- lifecycle ----------------------------------------------------------------------------
    def stats(self) -> ProducerStats:
        if not self.enabled:
            return ProducerStats(0, 0, 0, 0, 0, 0, 0, "disabled", None)
        counters = self._delivery.counters()
        return ProducerStats(
            events_emitted=self._emitted + len(self._rows) + self._batches_waiting() + self._refused_on_emit,
            events_sent=counters.events_sent,
            events_spooled=counters.events_spooled,
            events_dropped=counters.events_dropped + self._dropped_on_emit + self._refused_on_emit,
            bytes_sent=counters.bytes_sent,
            buffered_events=len(self._rows) + self._batches_waiting(),
            spool_bytes=counters.spool_bytes,
            broker=counters.health,
            last_error=counters.last_error,
            broker_resets=counters.broker_resets,
            events_resent=counters.events_resent,
            events_not_resent=counters.events_not_resent,
            send_failures=counters.send_failures,
            windows_lost=self._windows_lost,
            transfers=self._transfers,
        )

    def _batches_waiting(self) -> int:
        return self._batch_events_queued - self._batch_events_taken

    def messages_sent(self) -> dict[str, int]:
        """Messages encoded so far per stream (each stream's next sequence number)."""
        if not self.enabled:
            return {}
        return {stream.value: seq for stream, seq in self._seq.items()}

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Cut and hand over everything queued so far; True if it was sent (not only spooled)."""
        if self._closed:
            return False
        self._flushed.clear()
        self._flush_requested.set()
        self._flushed.wait(timeout_s)
        counters = self._delivery.counters()
        return not self._rows and counters.pending_bytes == 0 and counters.inflight_bytes == 0 \
            and counters.spool_bytes == 0

    def close(self, timeout_s: float | None = None) -> ProducerStats:
        """Send what is buffered plus a final heartbeat, waiting at most ``timeout_s``; never raises."""
        if self._closed:
            return self.stats()
        self._closed = True
        self._close_timeout = self._config.producer.close_timeout_s if timeout_s is None else timeout_s
        self._stopping.set()
        self._stopped.wait(self._close_timeout + 2.0)  # slack for a loaded machine; drain keeps a reserve too
        if self._tail is not None:
            self._tail.stop()
        for name in _EMIT_CALLS:  # later calls must not fill a queue nobody drains
            setattr(self, name, _noop)
        stats = self.stats()
        if stats.spool_bytes or stats.events_dropped or stats.events_not_resent:
            _say(f"run {self.run_id} rank {self.rank}: {stats.events_sent:,} events sent, "
                 f"{stats.spool_bytes:,} bytes left in the spool {self._spool_directory}, "
                 f"{stats.events_dropped:,} events dropped"
                 + (f", {stats.events_not_resent:,} acknowledged events not kept until stored (past the caps)"
                    if stats.events_not_resent else "")
                 + (" (`rankstream up` or `rankstream flush` delivers the spool)" if stats.spool_bytes else ""))
        return stats

    def _say_spooling(self) -> None:
        _say(f"run {self.run_id} rank {self.rank}: no broker at {self._config.bootstrap_servers} yet; events wait "
             f"in {self._spool_directory} and are sent when it answers (by `rankstream up` or `rankstream flush` "
             "if this process ends first)")

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _say(line: str) -> None:
    """One line to the job's stderr, where its user looks (never raises into the caller)."""
    try:
        print(f"rankstream: {line}", file=sys.stderr, flush=True)
    except Exception:  # a closed stderr at interpreter exit
        pass
