"""Kill a materializer at a chosen moment of its work, whatever the machine's speed.

A fixed sleep after `Popen` measures the interpreter's start as much as the work: on a busy CI machine every
kill landed before the first commit. Timing from the process's first line (printed once its imports are done)
measures the work only.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path


def kill_after_start(command: list[str], env: dict, log_path: Path, delay_s: float) -> None:
    """Run `command`, wait for its first stderr line (at most 60 s), let it work `delay_s`, then SIGKILL it."""
    with log_path.open("w") as sink:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=sink)
    deadline = time.monotonic() + 60
    while not log_path.read_text() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(delay_s)
    process.send_signal(signal.SIGKILL)
    process.wait(10)
