"""torch.profiler streaming: every profiling window goes to the bus, no trace file is written.

``ProfilerStream`` is an ``on_trace_ready`` handler. On the training thread it only takes the
window's Kineto activities (``prof.profiler.kineto_results.trace_activities()``: absolute ns, about
60 ms per 100k events; ``prof.events()`` would cost seconds) and hands them to a worker thread,
which converts them to trace events:

* ``cat`` is the activity type (``cpu_op``, ``user_annotation``, ``python_function``,
  ``cpu_instant_event`` for memory events, ``kernel``...), ``ph`` is ``X`` or ``i``;
* ``pid``/``tid`` are Kineto's device and resource ids (process and thread ids on the CPU), plus
  ``M`` events naming the process after the rank and the threads after their Python names;
* ``args`` is Kineto's own metadata (shapes and dtypes with ``record_shapes``, flops with
  ``with_flops``, bytes and addresses of memory events, stack links with ``with_stack``);
* ``step`` comes from the ``ProfilerStep#N`` span that contains the event;
* ``distributedInfo`` (rank, world size, backend) goes into the rank metadata once.

The schedule (``skip_first``/``wait``/``warmup``/``active``/``repeat``) is torch's own, untouched.
"""

from __future__ import annotations

import bisect
import os
import queue
import threading
from typing import Any, Callable

__all__ = ["ProfilerStream", "profile"]

_INSTANT_TYPES = {"cpu_instant_event"}
_STEP_PREFIX = "ProfilerStep#"


def _window_steps(activities: list) -> tuple[list[int], list[int], list[int]]:
    """Sorted (starts, ends, step numbers) of the window's ProfilerStep#N spans."""
    spans = []
    for activity in activities:
        name = activity.name()
        if name.startswith(_STEP_PREFIX):
            try:
                number = int(name[len(_STEP_PREFIX):])
            except ValueError:
                continue
            start = activity.timestamp()
            spans.append((start, start + activity.duration(), number))
    spans.sort()
    return [s[0] for s in spans], [s[1] for s in spans], [s[2] for s in spans]


def _thread_names() -> dict[int, str]:
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


class ProfilerStream:
    """``on_trace_ready`` handler that streams each window through ``producer``.

    ``then`` is called after ours, for users who also want torch's own handler (e.g. a
    TensorBoard export) on the same windows.
    """

    def __init__(self, producer, rank: int, then: Callable[[Any], None] | None = None,
                 distributed_info: Callable[[], dict | None] | None = None) -> None:
        self._producer = producer
        self._rank = rank
        self._then = then
        self._distributed_info = distributed_info
        self._sent_distributed_info = False
        self._queue: queue.Queue = queue.Queue(maxsize=4)
        self._named: set[tuple[int, int]] = set()
        self.windows = 0
        self.events = 0
        self.dropped_windows = 0
        self._worker = threading.Thread(target=self._convert_loop, name="rankstream-profiler", daemon=True)
        self._worker.start()

    def __call__(self, prof) -> None:
        """Runs on the training thread at the end of each window: take the activities, queue them."""
        try:
            results = prof.profiler.kineto_results
            activities = results.trace_activities()
            names = _thread_names()
            try:
                self._queue.put_nowait((results, activities, names))
            except queue.Full:  # the converter is far behind: drop this window rather than block training
                self.dropped_windows += 1
            self._send_distributed_info(prof)
        except Exception:
            pass  # never break the training loop over a trace
        if self._then is not None:
            self._then(prof)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued window has been converted (for tests and shutdown)."""
        done = threading.Event()
        self._queue.put((None, None, done))
        done.wait(timeout_s)

    def _send_distributed_info(self, prof) -> None:
        if self._sent_distributed_info:
            return
        self._sent_distributed_info = True
        info = None
        try:
            info = self._distributed_info() if self._distributed_info else prof._get_distributed_info()
        except Exception:
            info = None
        if info:
            self._producer.emit_rank_metadata(backend=info.get("backend"),
                                              metadata={"distributedInfo": _jsonable(info)})

    def _convert_loop(self) -> None:
        while True:
            results, activities, extra = self._queue.get()
            if results is None:
                extra.set()
                continue
            try:
                self._convert(activities, extra)
            except Exception:
                pass
            del results, activities

    def _convert(self, activities: list, thread_names: dict[int, str]) -> None:
        starts, ends, numbers = _window_steps(activities)
        emit = self._producer.emit
        for activity in activities:
            kind = activity.type()
            kind = kind if isinstance(kind, str) else str(kind)
            ts = activity.timestamp()
            step = None
            if starts:
                i = bisect.bisect_right(starts, ts) - 1
                if i >= 0 and ts < ends[i]:
                    step = numbers[i]
            instant = kind in _INSTANT_TYPES
            pid, tid = activity.device_id(), activity.resource_id()
            metadata = activity.metadata_json()
            emit(activity.name(), kind, "i" if instant else "X", ts, 0 if instant else activity.duration(),
                 pid, tid, step, activity.flow_id() or None, activity.correlation_id() or None,
                 "{" + metadata + "}" if metadata else None)
            if (pid, tid) not in self._named:
                self._name_track(pid, tid, ts, thread_names)
        self.windows += 1
        self.events += len(activities)

    def _name_track(self, pid: int, tid: int, ts: int, thread_names: dict[int, str]) -> None:
        emit = self._producer.emit
        if (pid, 0) not in self._named:
            self._named.add((pid, 0))
            emit("process_name", "__metadata", "M", ts, 0, pid, 0, None, None, None,
                 {"name": f"rank {self._rank}" + (f" (pid {pid})" if pid == os.getpid() else "")})
            emit("process_sort_index", "__metadata", "M", ts, 0, pid, 0, None, None, None,
                 {"sort_index": self._rank})
        self._named.add((pid, tid))
        emit("thread_name", "__metadata", "M", ts, 0, pid, tid, None, None, None,
             {"name": thread_names.get(tid, f"thread {tid}")})


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def profile(stream: ProfilerStream, *, wait: int = 1, warmup: int = 1, active: int = 3, repeat: int = 0,
            skip_first: int = 0, record_shapes: bool = True, profile_memory: bool = False,
            with_stack: bool = False, with_flops: bool = False, activities=None, **kwargs):
    """A ``torch.profiler.profile`` on a schedule, streaming through ``stream`` (Composer's
    TorchProfiler, without files). Call ``.step()`` once per training step, as with torch's."""
    import torch.profiler as tp

    return tp.profile(
        activities=activities or [tp.ProfilerActivity.CPU],
        schedule=tp.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first),
        on_trace_ready=stream,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
        with_flops=with_flops,
        **kwargs,
    )
