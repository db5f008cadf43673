"""The Flight Recorder tap: streams a rank's FR ring buffer while the job runs.

Every ``interval_s`` a daemon thread snapshots the buffer and publishes only entries that are new
or whose state changed (keyed by ``record_id``), the process groups when they change, and the
per-group progress (last enqueued/started/completed collective), which rides on heartbeats.

It must never block, even while a collective hangs. torch's pickle dump with stack traces blocks
until a hung gloo collective times out; the JSON dump returns at once but has no frames. So each
snapshot asks a helper thread for the pickle dump (frames included) and waits a short moment; if
the helper is stuck, the snapshot falls back to the JSON dump and the helper is left to finish on
its own (no second one is started meanwhile).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

from rankstream.schemas.fr_dump import entry_from_dump, groups_from_pg_config, status_from_pg_status
from rankstream.schemas.safe_pickle import safe_loads

__all__ = ["FlightRecorderTap", "read_dump"]

_FRAMES_WAIT_S = 0.25


def _torch_dumps() -> tuple[Callable[[], bytes], Callable[[], bytes]]:
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    return (
        lambda: _dump_fr_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False),
        lambda: _dump_fr_trace_json(includeCollectives=True, onlyActive=False),
    )


def read_dump(raw: bytes) -> dict[str, Any]:
    """A dump as a dict, whether torch gave pickle or JSON bytes."""
    if raw[:1] in (b"{", b"["):
        return json.loads(raw)
    return safe_loads(raw)


class _Helper:
    """Runs one blocking call on a daemon thread and hands back its result if it finishes."""

    def __init__(self, call: Callable[[], bytes]) -> None:
        self._call = call
        self._done = threading.Event()
        self._result: bytes | None = None
        threading.Thread(target=self._run, name="rankstream-fr-frames", daemon=True).start()

    def _run(self) -> None:
        try:
            self._result = self._call()
        except Exception:
            self._result = None
        self._done.set()

    def wait(self, timeout_s: float) -> tuple[bool, bytes | None]:
        return self._done.wait(timeout_s), self._result


class FlightRecorderTap:
    def __init__(self, producer, interval_s: float = 1.0, backend: str | None = None,
                 dumps: tuple[Callable[[], bytes], Callable[[], bytes]] | None = None) -> None:
        self._producer = producer
        self._interval = interval_s
        self._backend = backend
        self._dumps = dumps
        self._seen: dict[int, tuple] = {}
        self._groups: list | None = None
        self._helper: _Helper | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.snapshots = 0
        self.published = 0
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rankstream-fr-tap", daemon=True)
        self._thread.start()

    def stop(self, final_snapshot: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if final_snapshot:
            self.snapshot()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.snapshot()

    def snapshot(self) -> int:
        """Publish what changed since the last snapshot; returns how many entries. Never raises."""
        with self._lock:
            try:
                dump = self._read()
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                return 0
            self.snapshots += 1
            return self._publish(dump)

    def _read(self) -> dict[str, Any]:
        if self._dumps is None:
            self._dumps = _torch_dumps()
        with_frames, without_frames = self._dumps
        if self._helper is None:
            self._helper = _Helper(with_frames)
        finished, raw = self._helper.wait(_FRAMES_WAIT_S)
        if finished:
            self._helper = None
            if raw:
                return read_dump(raw)
        return read_dump(without_frames())

    def _publish(self, dump: dict[str, Any]) -> int:
        changed = []
        present: dict[int, tuple] = {}  # only what the ring still holds, so memory stays bounded
        for raw_entry in dump.get("entries") or []:
            try:
                entry = entry_from_dump(raw_entry)
            except ValueError:
                continue
            fingerprint = (entry["state"], entry["time_discovered_started_ns"],
                           entry["time_discovered_completed_ns"], entry["retired"], bool(entry["frames"]))
            present[entry["record_id"]] = fingerprint
            if self._seen.get(entry["record_id"]) != fingerprint:
                changed.append(entry)
        self._seen = present
        if changed:
            self._producer.emit_fr_entries(changed)
            self.published += len(changed)
        groups = groups_from_pg_config(dump.get("pg_config"), self._backend)
        if groups and groups != self._groups:
            self._groups = groups
            self._producer.emit_process_groups(groups)
        status = status_from_pg_status(dump.get("pg_status"))
        if status:
            self._producer.set_collectives(status)
        return len(changed)
