"""The rank-side API used inside training code.

    import rankstream
    rankstream.init()                          # idempotent; rank and world size from torchrun or the group
    with rankstream.span("forward"):           # also usable as @rankstream.span("forward")
        loss = model(batch)
    rankstream.counter("memory", {"allocated_mb": 512})
    rankstream.step()                          # step marker; later events carry the step number
    with rankstream.profile(active=3) as prof: # torch.profiler on a schedule, streamed, no files
        ...; prof.step()

Every call is a no-op before ``init``, after ``shutdown`` and with ``enabled=False`` (or
``RANKSTREAM_DISABLED=1``). None of them blocks or raises into the training loop.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from typing import Any, Callable, Mapping

from rankstream.producers.profiler import profile as streaming_profile
from rankstream.producers.session import RankSession, _dist, resolve_identity
from rankstream.schemas.config import Config
from rankstream.schemas.settings import (
    enable_flight_recorder,
    endpoint_mismatch,
    env_flag,
    flight_recorder_buffer_size,
    launch_environment,
    load_config,
)

__all__ = ["init", "shutdown", "span", "instant", "counter", "step", "profile", "session"]

_session = None
_lock = threading.Lock()
_get_tid = threading.get_native_id


def init(run_id: str | None = None, rank: int | None = None, world_size: int | None = None,
         *, enabled: bool = True, config: Config | None = None, metadata: Mapping[str, Any] | None = None,
         fr_tap: bool = True, fr_interval_s: float = 1.0, fr_full_every_s: float = 1.0, fr_buffer_size: int = 2000,
         clock_sync: bool = True, clock_sync_interval_s: float = 60.0):
    """Start streaming this rank. Safe to call more than once: later calls return the same session.

    Called before ``init_process_group``, it also sets ``TORCH_FR_BUFFER_SIZE`` (unless already
    set) so that torch records collectives in its Flight Recorder. Called after, the recorder is
    on only if that variable was set before the group was created (see the README).

    The FR tap looks at the groups' progress every ``fr_interval_s`` and dumps the ring (only if
    anything progressed) at most every ``fr_full_every_s``; clock sync runs every
    ``clock_sync_interval_s``.
    """
    global _session
    with _lock:
        if _session is not None:
            return _session
        if not enabled or env_flag("DISABLED"):
            return None
        if fr_tap and _dist() is None:
            enable_flight_recorder(fr_buffer_size)
        launch = launch_environment()
        run_id, rank, world_size = resolve_identity(run_id, rank, world_size, launch=launch)
        config = config or load_config()
        if rank == 0 and (mismatch := endpoint_mismatch(config)):
            print(f"rankstream: warning: {mismatch}", file=sys.stderr, flush=True)
        _session = RankSession(
            run_id=run_id, rank=rank, world_size=world_size, config=config, launch=launch,
            metadata=dict(metadata) if metadata else None,
            fr_tap=fr_tap and flight_recorder_buffer_size() > 0, fr_interval_s=fr_interval_s,
            fr_full_every_s=fr_full_every_s,
            clock_sync=clock_sync, clock_sync_interval_s=clock_sync_interval_s, requests=True,
        )
        return _session


def session():
    """The current session, or None."""
    return _session


def shutdown(timeout_s: float | None = None) -> None:
    """Final FR snapshot and flush; afterwards every call is a no-op until the next ``init``."""
    global _session
    with _lock:
        current, _session = _session, None
    if current is not None:
        current.shutdown(timeout_s)


class span:
    """A named region: a ``B`` event on entry, an ``E`` event on exit, and an ``i`` event named
    ``<name>:error`` when an exception escapes (the exception still propagates)."""

    __slots__ = ("name", "cat", "args")

    def __init__(self, name: str, cat: str = "user_annotation", **args: Any) -> None:
        self.name, self.cat, self.args = name, cat, args or None

    def __enter__(self) -> "span":
        s = _session
        if s is not None:
            s.producer.emit(self.name, self.cat, "B", ts_ns=time.time_ns(), dur_ns=0, pid=s.pid, tid=_get_tid(),
                            step=s.step, flow_id=None, correlation_id=None, args=self.args)
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        s = _session
        if s is not None:
            now, tid = time.time_ns(), _get_tid()
            s.producer.emit(self.name, self.cat, "E", ts_ns=now, dur_ns=0, pid=s.pid, tid=tid, step=s.step)
            if kind is not None:
                s.producer.emit(f"{self.name}:error", "error", "i", ts_ns=now, dur_ns=0, pid=s.pid, tid=tid,
                                step=s.step, flow_id=None, correlation_id=None,
                                args={"error": kind.__name__, "message": str(value)[:500]})
        return False

    def __call__(self, function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with span(self.name, self.cat, **(self.args or {})):
                return function(*args, **kwargs)

        return wrapper


def instant(name: str, cat: str = "user_instant", **args: Any) -> None:
    s = _session
    if s is not None:
        s.producer.emit(name, cat, "i", ts_ns=time.time_ns(), dur_ns=0, pid=s.pid, tid=_get_tid(), step=s.step,
                        flow_id=None, correlation_id=None, args=args or None)


def counter(name: str, values: Mapping[str, float], cat: str = "user_counter") -> None:
    """A Chrome counter event: one track per key of ``values``."""
    s = _session
    if s is not None:
        s.producer.emit(name, cat, "C", ts_ns=time.time_ns(), dur_ns=0, pid=s.pid, tid=_get_tid(), step=s.step,
                        flow_id=None, correlation_id=None, args=values)


def step(number: int | None = None) -> int | None:
    """Mark the start of a training step (the next one, or ``number``); returns the step."""
    return _mark_step(number, None)


#: Carried by the marks ``rankstream run`` sets after each optimizer step (see ``after_optimizer_step``).
AFTER_OPTIMIZER = {"marked_by": "optimizer"}


def after_optimizer_step() -> int | None:
    """``rankstream run``'s mark, set when an iteration's optimizer step is done: the next step
    starts here. Unlike a mark at the top of the loop, it says nothing of where the step it opens
    ends: after the last one come the job's teardown or a hang, so ``run_steps`` keeps that step
    open (``finished`` false) unless another mark follows."""
    return _mark_step(None, AFTER_OPTIMIZER)


def _mark_step(number: int | None, args: Mapping[str, Any] | None) -> int | None:
    s = _session
    if s is None:
        return None
    s.step = number if number is not None else (0 if s.step is None else s.step + 1)
    s.producer.emit("step", "step", "i", ts_ns=time.time_ns(), dur_ns=0, pid=s.pid, tid=_get_tid(), step=s.step,
                    flow_id=None, correlation_id=None, args=args)
    s.on_step()  # a window `rankstream profile` asked for opens, advances or closes here
    return s.step


def profile(then: Callable | None = None, **options: Any):
    """``torch.profiler.profile`` on a schedule (``wait=1, warmup=1, active=3`` by default), streamed.

    Options are those of :func:`rankstream.producers.profiler.profile`. Without a session it is
    torch's profiler with no handler, so training code needs no branches.
    """
    s = _session
    if s is None:
        import torch.profiler as tp  # torch is the job's, not a dependency

        return tp.profile(schedule=tp.schedule(wait=options.get("wait", 1), warmup=options.get("warmup", 1),
                                               active=options.get("active", 3)), on_trace_ready=then)
    return streaming_profile(s.profiler_stream(then=then), **options)
