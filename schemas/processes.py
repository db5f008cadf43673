"""Processes rankstream starts and later stops: is a pid still alive, and stopping one.

Kept at the bottom layer because the broker launcher, the materializer's query server and ``up``/
``down`` all need them.
"""

from __future__ import annotations

import os
import signal
import time

__all__ = ["process_alive", "stop_process", "yield_to_training", "start_ticks", "is_process", "descendants"]

#: How much lower the broker and materializer run than the job (``nice``): on the training node
#: they take only the CPU the ranks leave (docs/benchmarks.md, `rankstream run`'s overhead).
BACKGROUND_NICE = 10


def yield_to_training() -> None:
    """``preexec_fn`` of the background services: lower their CPU priority below the job's."""
    try:
        os.nice(BACKGROUND_NICE)
    except OSError:  # not permitted: they run at the normal priority
        pass


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22): with the
    pid, an identity that no later process reusing the pid shares. None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def is_process(pid: int, started: int | None, *, command_has: str) -> bool:
    """Whether ``pid`` is alive and still the process a pid file recorded: the same start time,
    or, for a record without one (written by an older version), a command line naming
    ``command_has``. A stale pid file must never point a signal at someone else's process."""
    if not process_alive(pid):
        return False
    now = start_ticks(pid)
    if started is not None and now is not None:
        return now == started
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return command_has.encode() in cmdline.read()
    except OSError:
        return started is not None  # no /proc: trust a record that has a start time


def descendants(pid: int) -> dict[int, int | None]:
    """Every process below ``pid`` (children, their children, ...), as pid -> start ticks. A
    launcher such as torchrun starts each worker in a session of its own, so a signal to the
    launcher's process group never reaches them, and once the launcher is gone they belong to
    init: the tree has to be read while the launcher lives."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):  # gone meanwhile
                continue
            parents.setdefault(parent, []).append(int(entry))
    found, todo = {}, list(parents.get(pid, []))
    while todo:
        child = todo.pop()
        if child not in found:
            found[child] = start_ticks(child)
            todo += parents.get(child, [])
    return found


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child still "exists"; look at its state
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def stop_process(pid: int, timeout_s: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``timeout_s``; True if the process is gone."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process_alive(pid):
            _reap(pid)
            return True
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    time.sleep(0.1)
    _reap(pid)
    return not process_alive(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
