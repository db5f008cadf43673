"""torch.profiler streaming: every profiling window goes to the bus, no trace file is written.

``ProfilerStream`` is an ``on_trace_ready`` handler. On the training thread it only takes the
window's Kineto activities (``prof.profiler.kineto_results.trace_activities()``: absolute ns, and
far cheaper than ``prof.events()``, which builds Python objects per event) and hands them to a worker thread,
which converts them to trace batches a whole column at a time (see :func:`window_columns`):

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

import os
import queue
import threading
from typing import Any, Callable

import numpy as np

from rankstream.producers.trace_columns import step_number, steps_by_pid, steps_column, trace_batches
from rankstream.schemas.trace import NULL_INT

__all__ = ["ProfilerStream", "profile", "periodic_windows", "window_columns", "job_activities"]

_INSTANT_TYPES = frozenset({"cpu_instant_event"})


def window_columns(activities: list) -> dict[str, Any]:
    """A window's Kineto activities as ``TraceBatch`` columns.

    Each accessor is mapped over the whole list as the unbound method of the activity class, so
    the loop runs in C. A Python loop making the nine accessor calls per activity and one
    ``Producer.emit`` per event took 1.3-1.8 times as long (encoding included), and the converter
    holds the GIL the training thread needs meanwhile. ``metadata_json()`` (Kineto building the
    args text) is a third to a half of what is left."""
    activity_type = type(activities[0])  # every activity is torch's _ITraceActivity binding

    def each(accessor: str) -> list:
        return list(map(getattr(activity_type, accessor), activities))

    names, kinds = each("name"), [k if type(k) is str else str(k) for k in each("type")]
    instant = [k in _INSTANT_TYPES for k in kinds]
    ts = np.array(each("timestamp"), dtype=np.int64)
    dur = np.where(instant, 0, np.array(each("duration"), dtype=np.int64))
    pids = np.array(each("device_id"), dtype=np.int64)
    spans = [(int(pids[i]), int(ts[i]), int(ts[i] + dur[i]), step)
             for i, name in enumerate(names) if (step := step_number(name)) is not None]
    return {
        "name": names,
        "cat": kinds,
        "ph": ["i" if i else "X" for i in instant],
        "ts_ns": ts,
        "dur_ns": dur,
        "pid": pids,
        "tid": np.array(each("resource_id"), dtype=np.int64),
        "step": steps_column(ts, pids, steps_by_pid(spans)),
        "flow_id": _zero_as_null(each("flow_id")),
        "correlation_id": _zero_as_null(each("correlation_id")),
        "args": ["{" + text + "}" if text else None for text in each("metadata_json")],
    }


def _zero_as_null(values: list) -> np.ndarray:
    """Kineto reports a missing flow or correlation id as 0."""
    column = np.array(values, dtype=np.int64)
    return np.where(column == 0, NULL_INT, column)


def _thread_names() -> dict[int, str]:
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


class ProfilerStream:
    """``on_trace_ready`` handler that streams each window through ``producer``.

    ``then`` is called after ours, for users who also want torch's own handler (e.g. a
    TensorBoard export) on the same windows.
    """

    def __init__(self, producer, rank: int, then: Callable[[Any], None] | None = None,
                 *, distributed_info: Callable[[], dict | None] | None = None) -> None:
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
        #: Windows that could not be taken or converted, and the last reason.
        self.failed_windows = 0
        self.last_error: str | None = None
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
                self._producer.count_lost_window("the converter was still busy with earlier windows")
            self._send_distributed_info(prof)
        except Exception as exc:  # never break the training loop over a trace: counted instead
            self.failed_windows += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            self._producer.count_lost_window(self.last_error)
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
        except Exception:  # an older torch or no process group: the distributed info is optional
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
            except Exception as exc:  # an activity torch changed the shape of: counted, the next window goes on
                self.failed_windows += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                self._producer.count_lost_window(self.last_error)
            del results, activities

    def _convert(self, activities: list, thread_names: dict[int, str]) -> None:
        if activities:
            columns = window_columns(activities)
            for batch in trace_batches(columns, self._producer.batch_events):
                self._producer.offer_batch(batch)  # beyond the producer's bound: dropped and counted
            first_ts = int(columns["ts_ns"][0])
            tracks = set(zip(columns["pid"].tolist(), columns["tid"].tolist()))
            for pid, tid in sorted(tracks - self._named):
                self._name_track(pid, tid, first_ts, thread_names)
        self.windows += 1
        self.events += len(activities)

    def _name_track(self, pid: int, tid: int, ts: int, thread_names: dict[int, str]) -> None:
        emit = self._producer.emit
        if (pid, 0) not in self._named:
            self._named.add((pid, 0))
            emit("process_name", "__metadata", "M", ts_ns=ts, pid=pid,
                 args={"name": f"rank {self._rank}" + (f" (pid {pid})" if pid == os.getpid() else "")})
            emit("process_sort_index", "__metadata", "M", ts_ns=ts, pid=pid, args={"sort_index": self._rank})
        self._named.add((pid, tid))
        emit("thread_name", "__metadata", "M", ts_ns=ts, pid=pid, tid=tid,
             args={"name": thread_names.get(tid, f"thread {tid}")})


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
            with_stack: bool = False, with_flops: bool = False, activities=None, schedule=None, **kwargs):
    """A ``torch.profiler.profile`` on a schedule, streaming through ``stream`` (Composer's
    TorchProfiler, without files). Call ``.step()`` once per training step, as with torch's.
    ``schedule`` (a function of the step number) replaces the wait/warmup/active one."""
    import torch.profiler as tp  # the job brings torch; the rank side does not require it

    return tp.profile(
        activities=activities or [tp.ProfilerActivity.CPU],
        schedule=schedule or tp.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat,
                                         skip_first=skip_first),
        on_trace_ready=stream,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
        with_flops=with_flops,
        **kwargs,
    )


def periodic_windows(every: int, active: int, first: int = 10) -> Callable[[int], Any]:
    """A torch.profiler schedule for a job nobody edited: a window of ``active`` steps after the
    first ``first`` steps (a short job still gets one), then one every ``every`` steps; each
    window is preceded by one warm-up step, as torch's own schedule does."""
    import torch.profiler as tp  # the job brings torch

    if every < active + 2 or active < 1:
        raise ValueError(f"a window of {active} steps every {every} needs every >= active + 2 >= 3")
    actions = tp.ProfilerAction

    def action(step: int):
        if step < first - 1:
            return actions.NONE
        phase = (step - first + 1) % every
        if phase == 0:
            return actions.WARMUP
        if phase < active:
            return actions.RECORD
        return actions.RECORD_AND_SAVE if phase == active else actions.NONE

    return action


def job_activities() -> list:
    """What a window of a job nobody configured records: the CPU, and CUDA when torch sees a GPU."""
    import torch  # the job brings torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities
