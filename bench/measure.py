"""Measuring a command the way the benchmarks report it: wall time and the peak RSS of its whole
process tree, sampled every 50 ms."""

from __future__ import annotations

import subprocess
import threading
import time

import psutil

__all__ = ["run_measured"]


def run_measured(command: list[str], timeout_s: float, env: dict | None = None,
                 also_watch: list[int] = ()) -> tuple[str, float, float, int]:
    """(stdout+stderr, wall seconds, peak RSS in MB of the process tree plus ``also_watch`` pids
    (a materializer serving the command), exit code)."""
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    peak = [0.0]
    done = threading.Event()
    watched = [psutil.Process(pid) for pid in also_watch]

    def sample() -> None:
        root = psutil.Process(process.pid)
        while not done.wait(0.05):
            try:
                rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True), *watched])
                peak[0] = max(peak[0], rss / 2**20)
            except psutil.Error:
                pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        output += "\n(timed out)"
    done.set()
    sampler.join()
    return output, time.monotonic() - started, peak[0], process.returncode
