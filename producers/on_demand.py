"""Profiler windows opened on request (``rankstream profile``) at the next step boundary.

The request arrives on the listener's thread; the window is opened, stepped and closed on the
training thread, at step boundaries (``rankstream.step()``, or the optimizer-step marks of
``rankstream run``), as torch's profiler requires. The window streams like any other (through a
``ProfilerStream``), between two instants named ``on_demand_window`` that carry the request id,
so that the command that asked can tell its window from the periodic ones.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from rankstream.producers.profiler import job_activities

__all__ = ["OnDemandWindows", "WINDOW_MARK"]

#: The instant event that opens and closes a requested window (args: request id, edge).
WINDOW_MARK = "on_demand_window"


class OnDemandWindows:
    def __init__(self, producer, pid: int, make_stream: Callable[[], Any]) -> None:
        self._producer, self._pid, self._make_stream = producer, pid, make_stream
        self._pending: dict | None = None
        self._profiler = None
        self._request: dict | None = None
        self._steps_left = 0
        #: Requests that could not open a window, and why (the last one).
        self.failed = 0
        self.last_error: str | None = None

    def request(self, request: dict) -> None:
        """From any thread: open a window at the next step boundary (a newer request replaces one not started)."""
        self._pending = request

    @property
    def active(self) -> bool:
        return self._profiler is not None

    def on_step(self, step: int | None, wait: bool = False) -> None:
        """At each step boundary, on the training thread: open, advance or close the window
        (``wait``: another profiler records, so a pending request opens at a later boundary)."""
        if self._profiler is not None:
            self._steps_left -= 1
            if self._steps_left > 0:
                self._profiler.step()
                return
            self._close(step)
            return
        if self._pending is not None and not wait:
            request, self._pending = self._pending, None
            self._open(request, step)

    def _open(self, request: dict, step: int | None) -> None:
        try:
            import torch  # the job's

            profiler = torch.profiler.profile(activities=job_activities(), record_shapes=True,
                                              on_trace_ready=self._make_stream())
            self._mark(request, "start", step)
            profiler.start()
        except Exception as exc:  # another profiler holds Kineto, or torch refused: counted, training goes on
            self.failed += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            self._producer.count_lost_window(self.last_error)
            self._mark(request, "failed", step, error=self.last_error)
            return
        self._profiler, self._request, self._steps_left = profiler, request, request["active"]

    def _close(self, step: int | None) -> None:
        profiler, request, self._profiler, self._request = self._profiler, self._request, None, None
        try:
            profiler.stop()  # hands the window to the stream's converter thread
        except Exception as exc:  # the window is lost, not the step: counted
            self.failed += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            self._producer.count_lost_window(self.last_error)
        self._mark(request, "end", step)

    def _mark(self, request: dict, edge: str, step: int | None, **extra: Any) -> None:
        self._producer.emit(WINDOW_MARK, "rankstream", "i", ts_ns=time.time_ns(), dur_ns=0, pid=self._pid, tid=0,
                            step=step, args={"request": request["id"], "edge": edge, **extra})

    def close(self) -> None:
        """At shutdown: a window still open is closed and streamed."""
        if self._profiler is not None:
            self._close(None)
