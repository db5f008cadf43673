"""SIGTERM for a rank whose main thread is blocked in a collective.

rankstream flushes what a rank buffered before SIGTERM ends it, in a Python signal handler. Python
runs such handlers only on the main thread, between bytecodes: a rank blocked in a collective (gloo
waits in C++) never runs it, so a SIGTERM that would have ended the rank left it running, and
torchrun's teardown or a user's ``kill`` waited for nothing. The C-level handler still notes the
signal and writes its number to the wakeup fd (``signal.set_wakeup_fd``); a thread reading that fd
sees it at once and, when the main thread has not handled it within a grace, flushes and ends the
process itself, with the exit status a shell gives a process SIGTERM ended (128 + 15).

Only SIGTERM whose handler before rankstream's was the default is watched: that is the case where
rankstream changed what the signal does. The watch is not installed when another wakeup fd is set
(an asyncio loop's): it stays theirs.

A forked child (a DataLoader worker, a multiprocessing pool's worker) inherits the wakeup fd: the
SIGTERM that ends the child would write into the parent's socket, and the parent, whose own handler
never ran, would end itself two seconds later. So a child drops the wakeup fd at once (seen in the
test suite: a process pool's workers, terminated, ended the process that forked them with 143).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Callable

__all__ = ["SignalWatch"]

#: How long the main thread has to run the Python handler before the watch acts for it.
GRACE_S = 2.0


class SignalWatch:
    """The watch of one process: ``install`` once, and call ``handled`` from the Python handler."""

    def __init__(self, flush: Callable[[str], None], *, grace_s: float = GRACE_S) -> None:
        self._flush = flush
        self._grace = grace_s
        self._changed = threading.Condition()
        self._handled = self._arrived = 0  # SIGTERMs the Python handler ran for / the fd told of

    def handled(self, number: int) -> None:
        """Called by the Python handler when it runs: the main thread is not blocked."""
        if number == signal.SIGTERM:
            with self._changed:
                self._handled += 1
                self._changed.notify_all()

    def install(self) -> bool:
        """From the main thread, after the Python SIGTERM handler is set; False if not installed."""
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):  # not the main thread, or no wakeup fd here
            reader.close()
            writer.close()
            return False
        if previous != -1:  # someone else's (an event loop): give it back
            signal.set_wakeup_fd(previous)
            reader.close()
            writer.close()
            return False
        self._sockets = (reader, writer)  # kept open for the life of the process
        os.register_at_fork(after_in_child=self._forget_in_child)
        threading.Thread(target=self._watch, args=(reader,), name="rankstream-signals", daemon=True).start()
        return True

    def _forget_in_child(self) -> None:
        """In a forked child: the wakeup fd and the socket pair are the parent's, not this process's."""
        reader, writer = self._sockets
        try:
            current = signal.set_wakeup_fd(-1)
            if current not in (-1, writer.fileno()):  # another's, set since: it stays
                signal.set_wakeup_fd(current)
        except (ValueError, OSError):  # forked from a thread that is not the main one: nothing to undo
            pass
        reader.close()
        writer.close()

    def _watch(self, reader: socket.socket) -> None:
        while True:
            try:
                numbers = reader.recv(64)
            except OSError:
                return
            if not numbers:
                return
            with self._changed:
                self._arrived += numbers.count(signal.SIGTERM)
                if self._changed.wait_for(lambda: self._handled >= self._arrived, self._grace):
                    continue
            self._flush("signal SIGTERM (main thread blocked)")
            os._exit(128 + signal.SIGTERM)
