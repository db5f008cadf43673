"""The Flight Recorder tap: streams a rank's FR ring buffer while the job runs.

Cost is what shapes it: a dump with stack traces is the most expensive read, one without is an
order of magnitude cheaper, and the groups' progress alone (``includeCollectives=False``) is
nearly free (docs/benchmarks.md has the figures). So every ``interval_s`` the tap:

1. reads only the groups' progress (last enqueued/started/completed collective per group) and puts
   it on the heartbeats;
2. takes a full dump, without stack traces, only if progress was made since the last one and a
   dump is due. A dump holds the GIL for tens of milliseconds (torch builds it without releasing
   it), which the training thread waits out, so dumps are driven by need, not by a clock:
   when half the ring has been refilled (so no entry is ever missed), when a collective looks
   stuck (enqueued but not completed, with no progress since the last tick: the live hang
   detector needs those entries quickly), or when the rank has just stopped making progress (its
   peers may be waiting for it, and a paused rank is not slowed by the dump). Otherwise only for
   freshness: every ``full_every_s`` at most, and never more often than keeps these dumps under
   ``DUMP_CPU_SHARE`` of one core (with a full ring, about every 30 s), with ``DUMP_ALLOWANCE_S``
   to spend ahead of that share: a young ring's cheap reads are not held back by the cost of the
   first read (which pays one-time work), and a rank that dies in native code (an abort: no
   crash-path read) has lost at most the last second of its calls (live probe 10 e06: three
   ranks lost all nine of theirs);
3. publishes only entries that are new or whose state changed, keyed by ``record_id``, and the
   process groups when they change; while the producer would drop them anyway (the broker is down
   and its spool full), it takes no full dumps, and the next one after that publishes what the ring
   still holds;
4. when a collective looks stuck, also publishes the training thread's live Python stack
   (``sys._current_frames``, which never blocks) as a ``stalled_in_collective`` event; when
   neither its groups nor its count of transfers (``producers.transfer_count``) moved for a few
   ticks (a rank stuck outside collectives, the one its peers wait for, or a pipeline stage), as
   an ``idle_outside_collectives`` event, and again each time the stack moves while nothing else
   does (gloo's send/recv move no group: a rank that went from its data loader into a blocking
   receive would otherwise stay, by its one stack, at the loader).

Stack frames per entry come from the final snapshot (shutdown, uncaught exception, SIGTERM/SIGINT),
fetched on a helper thread with a timeout: during a hung gloo collective that dump blocks until the
collective times out, and the tap must never block.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from rankstream.producers.fr_reader import entry_from_dump, groups_from_pg_config, parse_dump, status_from_pg_status
from rankstream.producers.transfer_count import posted_by
from rankstream.schemas.stack_frames import frame_records

__all__ = ["FlightRecorderTap", "FlightRecorderDumps"]

#: Ticks without progress in any group before the rank's stack is published as "idle".
_IDLE_TICKS = 3


@dataclass(frozen=True)
class FlightRecorderDumps:
    """The three ways of reading the ring; tests pass stand-ins."""

    status: Callable[[], bytes]
    entries: Callable[[], bytes]
    entries_with_frames: Callable[[], bytes]

    @classmethod
    def from_torch(cls) -> "FlightRecorderDumps":
        from torch._C._distributed_c10d import _dump_fr_trace  # torch is the job's, not a dependency

        return cls(
            status=lambda: _dump_fr_trace(includeCollectives=False, includeStackTraces=False, onlyActive=False),
            entries=lambda: _dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False),
            entries_with_frames=lambda: _dump_fr_trace(includeCollectives=True, includeStackTraces=True,
                                                       onlyActive=False),
        )


def _call_with_timeout(call: Callable[[], bytes], timeout_s: float) -> bytes | None:
    """Run a call that may block on a daemon thread; None if it did not return in time."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(call()), name="rankstream-fr-frames", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return result[0] if result else None


def _group_exists() -> bool:
    """Whether the job's process group is up: a rank that has not communicated yet may already
    be the one its peers wait for (a stage stalled before its first send)."""
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()
    except Exception:  # no torch here: no group
        return False


def _pending(status: dict[str, dict[str, int]]) -> set[str]:
    return {group for group, s in status.items()
            if s.get("last_enqueued", -1) > s.get("last_completed", s.get("last_enqueued", -1))}


#: The most of one core the dumps taken only for freshness may use: each holds the GIL, so the
#: training thread waits on it (docs/benchmarks.md, "Measurements behind the code").
DUMP_CPU_SHARE = 0.002
DUMP_ALLOWANCE_S = 0.01


class FlightRecorderTap:
    def __init__(self, producer, interval_s: float = 1.0, full_every_s: float = 1.0, *, ring_size: int = 2000,
                 backend: str | None = None, dumps: FlightRecorderDumps | None = None,
                 main_thread_id: int | None = None, dump_cpu_share: float | None = DUMP_CPU_SHARE,
                 groups: Callable[[], list[dict[str, Any]]] | None = None,
                 dump_allowance_s: float = DUMP_ALLOWANCE_S) -> None:
        """``groups``: the process's process groups as torch lists them now, for dumps whose
        ``pg_config`` names none (gloo's holds only a nameless placeholder): the groups a job
        creates after ``init_process_group`` are reported with the first dump that follows."""
        self._producer = producer
        self._groups_now = groups
        self._dump_cpu_share = dump_cpu_share  # None: no CPU limit on periodic dumps
        self._interval = interval_s
        self._full_every = full_every_s
        self._ring = max(ring_size, 2)
        self._backend = backend
        self._dumps = dumps
        self._main_thread = main_thread_id or threading.main_thread().ident
        self._seen: dict[int, tuple] = {}
        self._groups: list | None = None
        self._status: dict[str, dict[str, int]] = {}
        self._status_at_full: dict[str, dict[str, int]] | None = None
        self._last_full = 0.0
        self._newest_record = -1  # the newest record_id of the last full dump
        self._records_per_s = 0.0  # how fast the ring filled between the last two dumps, p2p included
        # CPU seconds of dumps the share allows now (a token bucket holding at most the allowance)
        self._allowance = self._dump_budget = dump_allowance_s
        self._budget_at = time.monotonic()
        self._stall_reported: dict[str, int] = {}
        self._idle_ticks = 0
        self._transfers_at_last_tick = 0
        self._idle_where: tuple | None = None  # the stack last published as idle, as code and line per frame
        self._exiting = False  # set by the exit paths' reads: the training thread's stack is no longer its own
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.snapshots = 0
        self.full_dumps = 0
        self.published = 0
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rankstream-fr-tap", daemon=True)
        self._thread.start()

    def stop(self, final_snapshot: bool = True) -> None:
        self._exiting = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if final_snapshot:
            self.snapshot(final=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.snapshot()

    def snapshot(self, final: bool = False, *, full: bool = False) -> int:
        """One tick (see the module docstring); returns entries published. Never raises. ``full``:
        read the whole ring whatever the schedule says (a process about to die: the calls its
        peers will wait in were enqueued since the last full read)."""
        if final or full:  # only the exit paths ask for these
            self._exiting = True
        with self._lock:
            try:
                return self._tick(final, full)
            except Exception as exc:  # never raise into training: the tap's last_error says why
                self.last_error = f"{type(exc).__name__}: {exc}"
                return 0

    def _tick(self, final: bool, full: bool = False) -> int:
        if self._dumps is None:
            self._dumps = FlightRecorderDumps.from_torch()
        self.snapshots += 1
        previous, status = self._status, status_from_pg_status(
            parse_dump(self._dumps.status(), "the Flight Recorder's progress", entries=False).get("pg_status"))
        self._status = status
        if status:
            self._producer.set_collectives(status)
        stuck = _pending(status) & _pending(previous) if status == previous else set()
        # gloo's transfers move no group: their count tells a pipeline that moves from one that waits
        transfers = self._producer.transfers
        still = status == previous and transfers == self._transfers_at_last_tick
        self._transfers_at_last_tick = transfers
        self._idle_ticks = self._idle_ticks + 1 if still and (status or transfers or _group_exists()) else 0
        if not self._idle_ticks:
            self._idle_where = None
        published = 0
        if final or full or self._full_dump_due(stuck):
            started = time.thread_time()
            published = self._publish(parse_dump(self._dumps.entries(), "the Flight Recorder's ring", entries=False))
            self._dump_budget -= time.thread_time() - started  # the dump, its parse and diff
        if self._exiting:
            pass  # the training thread runs rankstream's way out (a flush, the final read): not where the rank was
        elif stuck:
            self._report_stall(stuck)
        elif self._idle_ticks >= _IDLE_TICKS:  # no group moved for a while: say where the rank is
            where = self._main_thread_at()
            if where != self._idle_where:
                self._idle_where = where
                self._report_stack("idle_outside_collectives", {"groups": status})
        if final:
            raw = _call_with_timeout(self._dumps.entries_with_frames, timeout_s=2.0)
            if raw:
                published += self._publish(parse_dump(raw, "the Flight Recorder's ring", entries=False))
        return published

    def _full_dump_due(self, stuck: set[str]) -> bool:
        if self._producer.refusing:  # the broker is down and the spool full: what it found would be dropped
            return False
        if self._status_at_full is None:
            return True
        if self._status == self._status_at_full:
            return False
        if stuck or self._idle_ticks == 1:
            return True
        now = time.monotonic()
        new = max(self._records_per_s * (now - self._last_full),  # sends and receives are not in the progress
                  sum(max(0, s.get("last_enqueued", 0) - self._status_at_full.get(g, {}).get("last_enqueued", -1))
                      for g, s in self._status.items()))
        if self._dump_cpu_share:
            self._dump_budget = min(self._allowance,
                                    self._dump_budget + self._dump_cpu_share * (now - self._budget_at))
            self._budget_at = now
        affordable = not self._dump_cpu_share or self._dump_budget >= 0
        return new >= self._ring // 2 or (now - self._last_full >= self._full_every and affordable)

    def _publish(self, dump: dict[str, Any]) -> int:
        self.full_dumps += 1
        self._status_at_full = dict(self._status)
        changed = []
        present: dict[int, tuple] = {}  # only what the ring still holds, so memory stays bounded
        for raw_entry in dump.get("entries") or []:
            fingerprint = (raw_entry.get("state"), raw_entry.get("time_discovered_started_ns"),
                           raw_entry.get("time_discovered_completed_ns"), raw_entry.get("retired"),
                           bool(raw_entry.get("frames")))
            record_id = raw_entry.get("record_id")
            present[record_id] = fingerprint
            if self._seen.get(record_id) != fingerprint:
                try:
                    changed.append(entry_from_dump(raw_entry))
                except ValueError:
                    continue
        self._seen = present
        self._note_fill_rate(max((r for r in present if isinstance(r, int)), default=self._newest_record))
        if changed:
            self._producer.emit_fr_entries(changed)
            self.published += len(changed)
        groups = groups_from_pg_config(dump.get("pg_config"), self._backend) or self._listed_groups()
        if groups and groups != self._groups:
            self._groups = groups
            self._producer.emit_process_groups(groups)
        return len(changed)

    def _listed_groups(self) -> list[dict[str, Any]]:
        try:
            return self._groups_now() if self._groups_now else []
        except Exception:  # the groups are metadata: a torch that lists them otherwise costs only them
            return []

    def _note_fill_rate(self, newest_record: int) -> None:
        now = time.monotonic()
        if self._newest_record >= 0 and now > self._last_full:
            self._records_per_s = max(0, newest_record - self._newest_record) / (now - self._last_full)
        self._newest_record, self._last_full = newest_record, now

    def _report_stall(self, groups: set[str]) -> None:
        """Publish where the training thread is, once per stuck collective."""
        fresh = {g for g in groups if self._stall_reported.get(g) != self._status[g].get("last_enqueued")}
        if not fresh:
            return
        for group in fresh:
            self._stall_reported[group] = self._status[group].get("last_enqueued")
        self._report_stack("stalled_in_collective", {"groups": {g: self._status[g] for g in sorted(fresh)}})

    def _main_thread_at(self) -> tuple:
        """The training thread's stack as (code, line) per frame: cheap to take every tick."""
        frame, where = sys._current_frames().get(self._main_thread), []
        while frame is not None and len(where) < 40:
            where.append((frame.f_code, frame.f_lineno))
            frame = frame.f_back
        return tuple(where)

    def _report_stack(self, name: str, args: dict) -> None:
        """Publish the training thread's live Python stack (innermost frame first), with the
        job's count of transfers then (the stack is current while the count stays) and the
        transfers its last request-returning call posted (what a ``wait()`` there waits for)."""
        frames = frame_records(sys._current_frames().get(self._main_thread))
        self._producer.emit(name, "rankstream", "i", ts_ns=time.time_ns(), dur_ns=0, pid=0, tid=0, step=None,
                            flow_id=None, correlation_id=None,
                            args={**args, "transfers": self._transfers_at_last_tick,
                                  "posted": posted_by(self._main_thread), "frames": frames})
