"""The materializer: the loop that turns bus topics into DuckDB tables.

It reads every partition from the offsets stored in DuckDB, hands each poll to the store (one
transaction per poll) and serves SQL to other processes while it holds the file. It survives a
missing topic, an unreachable broker and a failed write by printing one line and retrying; it
never exits on bad data (that goes to ``rejects``).

It also writes ``<state_dir>/materializer.json`` every couple of seconds (lag, throughput, last
error) for ``rankstream status``.

Broker restarts: the stored offsets belong to one broker incarnation, named by its topic ids.
On every open, and every ``_INCARNATION_CHECK_S`` while consuming, the materializer compares the
broker's topic ids with the stored ones. New ids mean the broker lost its log and offsets
restarted at 0: the stored offsets are dropped and every partition is read from its start
(producers resend their recent batches to the new broker, and batch keys drop the repeats).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from rankstream.consumers.prepare import PreparedBatch, prepare
from rankstream.consumers.source import KafkaSource, Source
from rankstream.consumers.store import Store, summarize_lag
from rankstream.consumers.stored_announcer import KafkaAnnouncements, StoredAnnouncer
from rankstream.producers.kafka_client import ensure_topics
from rankstream.schemas.config import Config
from rankstream.schemas.errors import RankstreamError, TransientError, is_transient
from rankstream.schemas.files import write_atomically
from rankstream.schemas.envelope import Stream
from rankstream.schemas.topics import Record, all_topics, topic_for

__all__ = ["Materializer", "MaterializerStatus", "status_path", "RETRY_S", "materializer_lag", "materializer_silent_s"]

RETRY_S = 2.0
_STATUS_EVERY_S = 2.0
_INCARNATION_CHECK_S = 1.0
#: DuckDB writes an insert of a row group (122,880 rows) or more straight into the database file;
#: a smaller insert, or an insert's last partial row group, may be merged with its neighbours and
#: written again when DuckDB checkpoints, inside a later commit. Three row groups or more per
#: transaction leave no two partial groups close enough to merge (docs/benchmarks.md, "Ingest").
#: A trace event takes at least 68 bytes in a batch (3 string codes, 7 integers), so this many
#: bytes of trace messages hold three row groups.
_TARGET_TRACE_BYTES = 3 * 122_880 * 80
#: How long a poll that already holds an eighth of that may wait for the rest, at most: enough at
#: the target rate, and a bound on the freshness it costs at lower rates.
_HOLD_S = 0.6


class _BrokerReset(TransientError):
    """The broker came back as a new incarnation while the materializer was reading it."""


@dataclass
class MaterializerStatus:
    pid: int
    started_at: float
    updated_at: float
    messages: int = 0
    events: int = 0
    rejected: int = 0
    duplicates: int = 0
    lag_messages: int | None = None
    events_per_s: float = 0.0
    last_error: str | None = None
    #: Times the broker came back without its log while this materializer ran.
    broker_resets: int = 0


def status_path(config: Config) -> Path:
    return config.state_dir / "materializer.json"


#: A status file older than this was left by a materializer that stopped or is stuck: it writes
#: one every ``_STATUS_EVERY_S`` while it runs.
STALE_AFTER_S = 10.0


def _status(config: Config) -> dict:
    try:
        status = json.loads(status_path(config).read_text())
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def materializer_lag(config: Config) -> int | None:
    """Messages on the bus the materializer has not stored yet, from its last status file; None
    when there is none, or it is stale (``materializer_silent_s``)."""
    status = _status(config)
    return None if _silent_s(status) else status.get("lag_messages")


def materializer_silent_s(config: Config) -> float | None:
    """How long the materializer's status file has not been written, when that is more than
    ``STALE_AFTER_S``; None when it is fresh or there is none."""
    return _silent_s(_status(config))


def _silent_s(status: dict) -> float | None:
    updated = status.get("updated_at")
    age = time.time() - updated if isinstance(updated, (int, float)) else None
    return age if age is not None and age > STALE_AFTER_S else None


class _Committer:
    """Commits prepared polls on its own thread, in order, one transaction each.

    DuckDB releases the GIL while it inserts, so the main thread decodes and projects the next
    poll meanwhile. After a failed commit every later batch is discarded: committing them would
    advance offsets past the failed one. The owner then restarts from the stored offsets.
    """

    def __init__(self, store: Store, on_commit: Callable) -> None:
        self._store = store
        self._on_commit = on_commit
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rankstream-commit", daemon=True)
        self._thread.start()

    def submit(self, batch: PreparedBatch) -> None:
        if self.error is not None:
            raise self.error
        self._queue.put(batch)

    def idle(self) -> bool:
        """Whether the committer took every batch handed over (it may still be committing the last)."""
        return self._queue.empty() or self.error is not None

    def wait_for_turn(self) -> None:
        """Until ``idle``: a batch handed over earlier would wait there for a commit to end while
        newer records piled up behind it (freshness, docs/benchmarks.md)."""
        while not self.idle():
            time.sleep(0.005)

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            if self.error is not None:
                continue
            try:
                self._on_commit(batch, self._store.commit(batch))
            except BaseException as exc:  # reported to the owner, which restarts from stored offsets
                self.error = exc

    def close(self) -> None:
        """Wait for queued batches to commit, then stop; raises the first commit error."""
        self._queue.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error


class Materializer:
    def __init__(self, config: Config, store: Store, source: Source | None = None, *,
                 log: Callable[[str], None] = print, max_records: int = 500,
                 announce: Callable[[bytes], None] | None = None) -> None:
        """``announce`` publishes what is stored for producers (``consumers.stored_announcer``);
        by default on the bus when reading Kafka, nowhere for another source."""
        self.config = config
        self.store = store
        if source is None and announce is None:
            announce = KafkaAnnouncements(config)
        self.source = source or KafkaSource(config, all_topics(config.topic_prefix))
        self._announcements = announce
        self._announcer = StoredAnnouncer(announce) if announce is not None else None
        self.log = log
        self.max_records = max_records
        self.status = MaterializerStatus(pid=os.getpid(), started_at=time.time(), updated_at=time.time())
        self._committed: dict[tuple[str, int], int] = {}
        self._incarnation: dict[str, str] = {}
        self._opened = False
        self._last_complaint = ""
        self._window = (time.monotonic(), 0)
        self._trace_topic = topic_for(config.topic_prefix, Stream.TRACE)

    def run(self, stop: threading.Event, until_caught_up: bool = False) -> MaterializerStatus:
        """Consume until ``stop`` is set (or, with ``until_caught_up``, until the ends seen at start)."""
        targets = None
        while not stop.is_set():
            try:
                self._open()
                if until_caught_up and targets is None:
                    targets = self.source.end_offsets()
                if self._consume(stop, targets):
                    break
            except _BrokerReset:
                self._close()  # reopened at once: _open starts the new incarnation's logs from 0
            except Exception as exc:
                described = str(exc) if isinstance(exc, RankstreamError) else f"{type(exc).__name__}: {exc}"
                if not is_transient(exc):  # a retry would fail the same way: say why and stop
                    self._failed(f"stopped: {described}", retrying=False)
                    raise
                self._failed(described)
                stop.wait(RETRY_S)
        self._publish_status()
        self._close()
        if self._announcer is not None:
            self._announcer.announce_all()  # the last commits too, before going
        if hasattr(self._announcements, "close"):
            self._announcements.close()
        return self.status

    def _consume(self, stop: threading.Event, targets: dict | None) -> bool:
        """Poll, prepare and hand over to the committer until stopped; True once caught up."""
        committer = _Committer(self.store, self._on_commit)
        last_status = last_check = time.monotonic()
        try:
            while not stop.is_set():
                committer.submit(prepare(self._gather(committer)))
                if targets is not None and self._caught_up(targets):
                    committer.close()
                    return self._caught_up(targets)
                now = time.monotonic()
                if self._announcer is not None:
                    self._announcer.tick(now)
                if now - last_check >= _INCARNATION_CHECK_S:
                    last_check = now
                    if self._new_incarnation(self.source.incarnation()):
                        raise _BrokerReset("the broker restarted without its log")
                if now - last_status >= _STATUS_EVERY_S:
                    last_status = now
                    self._publish_status()
        finally:
            committer.close()
        return False

    def _gather(self, committer: _Committer) -> list[Record]:
        """The records of the next transaction, at most ``max_records``: one poll, and more until
        the committer has taken the batch handed over before (what is read meanwhile is committed
        next, never left waiting behind a commit), and, when records arrive fast, until they fill
        ``_TARGET_TRACE_BYTES`` or ``_HOLD_S`` passes. A slow stream is handed over at once:
        holding it would only delay it."""
        records = self.source.poll(0.2, self.max_records)
        trace_bytes = self._trace_bytes(records)
        hold_until = time.monotonic() + _HOLD_S
        while len(records) < self.max_records:
            left = hold_until - time.monotonic()
            filling = _TARGET_TRACE_BYTES // 8 <= trace_bytes < _TARGET_TRACE_BYTES and left > 0
            waiting = not committer.idle()
            if not (filling or waiting):
                break
            more = self.source.poll(min(left, 0.02) if filling and not waiting else 0.02,
                                    self.max_records - len(records))
            if not more:  # a source may answer at once with nothing: do not spin
                time.sleep(0.005)
            records += more
            trace_bytes += self._trace_bytes(more)
        committer.wait_for_turn()
        return records

    def _trace_bytes(self, records: list[Record]) -> int:
        return sum(len(record.value) for record in records if record.topic == self._trace_topic and record.value)

    def _new_incarnation(self, topic_ids: dict[str, str]) -> bool:
        """True when a topic's id differs from the one the stored offsets belong to."""
        return any(self._incarnation.get(topic, topic_id) != topic_id for topic, topic_id in topic_ids.items())

    def _on_commit(self, batch: PreparedBatch, result) -> None:
        """Runs on the committer thread after each transaction."""
        self._committed.update(batch.next_offsets)
        if self._announcer is not None:
            self._announcer.note(batch.keys, self.store.stored_sequences)
        status = self.status
        status.messages += result.messages
        status.events += result.events
        status.rejected += result.rejected
        status.duplicates += result.duplicates
        self._last_complaint = ""
        status.last_error = None

    def _open(self) -> None:
        if self._opened:
            return
        if isinstance(self.source, KafkaSource):
            ensure_topics(self.config)
        self._adopt_incarnation(self.source.incarnation())
        self._committed = self.store.offsets()
        self.source.open(self._committed)
        self._opened = True

    def _adopt_incarnation(self, topic_ids: dict[str, str]) -> None:
        self._incarnation = self.store.incarnation()
        if topic_ids == self._incarnation:
            return
        reset = self._new_incarnation(topic_ids)
        self.store.adopt_incarnation(topic_ids, forget_offsets=reset)
        self._incarnation = dict(topic_ids)
        if reset:
            self.status.broker_resets += 1
            self.log("rankstream materializer: the broker restarted without its log (new topic ids); "
                     "reading every partition again from offset 0")

    def _close(self) -> None:
        if self._opened:
            self.source.close()
        self._opened = False

    def _caught_up(self, targets: dict) -> bool:
        committed = dict(self._committed)
        return all(committed.get(position, 0) >= end for position, end in targets.items())

    def _failed(self, message: str, retrying: bool = True) -> None:
        """A failed attempt: log it (once per distinct message), close the source so the next
        attempt opens afresh, and publish the status at once: a materializer that cannot even open
        (broker down, topics missing) must still show in ``rankstream status`` why."""
        self.status.last_error = message
        if message != self._last_complaint:
            self.log(f"rankstream materializer: {message}" + (f" (retrying every {RETRY_S:.0f} s)" if retrying else ""))
            self._last_complaint = message
        self._close()
        self._publish_status()

    def _publish_status(self) -> None:
        status = self.status
        now = time.monotonic()
        started, events = self._window
        if now > started:
            status.events_per_s = (status.events - events) / (now - started)
        self._window = (now, status.events)
        status.updated_at = time.time()
        if self._opened:
            try:
                status.lag_messages = summarize_lag(self.source.end_offsets(), dict(self._committed))
            except RankstreamError:
                status.lag_messages = None
        try:
            write_atomically(status_path(self.config), json.dumps(asdict(status)))
        except OSError:
            pass
