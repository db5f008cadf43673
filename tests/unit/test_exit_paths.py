"""A rank on its way out must end, whatever arrives while it flushes (a real process, a real signal).

An uncaught exception flushes what the rank buffered, reading its whole Flight Recorder ring; the
launcher's SIGTERM, sent because the rank failed, often lands during that read. The signal
handler flushed again on the same thread and waited for the tap's lock its own frame held: the
rank hung until torchrun's SIGKILL 30 s later (live probe 9, stacks captured), and the live hang
watch took the ranks that had ended for a deadlock.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Rank 0's session in the script's own process, with its hooks, on the in-memory bus.
SESSION = textwrap.dedent("""
    from rankstream.producers.producer import Producer
    from rankstream.producers.session import RankSession
    from rankstream.schemas.settings import LaunchEnvironment, load_config
    from tests.doubles import MemoryBus, MemoryTransport

    def rank_session(db, state):
        config = load_config({"db_path": db, "state_dir": state, "topic_prefix": "exit"}, env={})
        launch = LaunchEnvironment(rank=0, world_size=2, local_rank=0, node_rank=0, local_world_size=2,
                                   run_id=None, master=None)
        producer = Producer(run_id="exit", rank=0, world_size=2, config=config,
                            transport=MemoryTransport(MemoryBus()))
        return RankSession(run_id="exit", rank=0, world_size=2, config=config, launch=launch, fr_tap=False,
                           clock_sync=False, producer=producer)
""")


def _run_script(script: str, tmp_path) -> subprocess.CompletedProcess:
    script = SESSION + script.replace("{db}", str(tmp_path / "db.duckdb")).replace("{state}", str(tmp_path / "state"))
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=180)


SCRIPT = textwrap.dedent("""
    import os, signal, threading, time

    class RingReadDuringTeardown:
        '''A tap whose full read takes a while, and the launcher's SIGTERM arrives during it.'''
        def __init__(self):
            self._lock, self.reads = threading.Lock(), 0
        def snapshot(self, final=False, *, full=False):
            with self._lock:
                self.reads += 1
                if self.reads == 1:
                    os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.3)
            return 0
        def stop(self, final_snapshot=False):
            pass

    session = rank_session("{db}", "{state}")
    session.tap = RingReadDuringTeardown()
    raise ValueError("bad batch")
""")


def test_a_sigterm_during_an_exception_s_flush_does_not_hang_the_rank(tmp_path):
    started = time.monotonic()
    done = _run_script(SCRIPT, tmp_path)
    lasted = time.monotonic() - started
    assert "ValueError: bad batch" in done.stderr, done.stderr
    # it hung for good before; it takes 1-2 s alone, 24 s was seen beside another test worker
    assert lasted < 120, f"the rank took {lasted:.0f} s to end"
    assert done.returncode == 1, done.stderr  # the exception's own exit, once its flush is done


FORKED = textwrap.dedent("""
    import multiprocessing, signal, sys, time

    def worker(report):
        report.put(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
        time.sleep(60)

    session = rank_session("{db}", "{state}")
    context = multiprocessing.get_context("fork")
    report = context.Queue()
    child = context.Process(target=worker, args=(report,))
    child.start()
    print("child default:", report.get(timeout=20))
    child.terminate()  # SIGTERM, as a DataLoader or a pool ends a worker that does not stop
    child.join()
    time.sleep(4)  # past the signal watch's grace
    print("parent alive")
""")


def test_terminating_a_forked_worker_neither_ends_nor_flushes_the_rank(tmp_path):
    """A forked child inherited the signal watch's wakeup fd and rankstream's SIGTERM handler: its
    own SIGTERM wrote into the parent's socket, and the parent, whose handler never ran, ended
    itself with 143 two seconds later (seen in the test suite, a process pool's workers)."""
    done = _run_script(FORKED, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "child default: True" in done.stdout and "parent alive" in done.stdout, done.stdout


def test_an_uncaught_exception_s_record_says_where_it_was_raised():
    from rankstream.producers.session import _raised_at

    def monitored_barrier():
        raise RuntimeError("Rank 3 failed to pass monitoredBarrier")

    def main():
        monitored_barrier()

    try:
        main()
    except RuntimeError as exc:
        frames = _raised_at(exc.__traceback__)
    assert [frame["name"] for frame in frames[:3]] == ["monitored_barrier", "main",
                                                       "test_an_uncaught_exception_s_record_says_where_it_was_raised"]
    assert _raised_at(None) == []
