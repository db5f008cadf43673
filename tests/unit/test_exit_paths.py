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

SCRIPT = textwrap.dedent("""
    import os, signal, threading, time
    from rankstream.producers.producer import Producer
    from rankstream.producers.session import RankSession
    from rankstream.schemas.settings import LaunchEnvironment, load_config
    from tests.doubles import MemoryBus, MemoryTransport

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

    config = load_config({"db_path": "{db}", "state_dir": "{state}", "topic_prefix": "exit"}, env={})
    launch = LaunchEnvironment(rank=0, world_size=2, local_rank=0, node_rank=0, local_world_size=2,
                               run_id=None, master=None)
    producer = Producer(run_id="exit", rank=0, world_size=2, config=config, transport=MemoryTransport(MemoryBus()))
    session = RankSession(run_id="exit", rank=0, world_size=2, config=config, launch=launch, fr_tap=False,
                          clock_sync=False, producer=producer)
    session.tap = RingReadDuringTeardown()
    raise ValueError("bad batch")
""")


def test_a_sigterm_during_an_exception_s_flush_does_not_hang_the_rank(tmp_path):
    script = SCRIPT.replace("{db}", str(tmp_path / "db.duckdb")).replace("{state}", str(tmp_path / "state"))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    lasted = time.monotonic() - started
    assert "ValueError: bad batch" in done.stderr, done.stderr
    assert lasted < 20, f"the rank took {lasted:.0f} s to end"  # behavioural bound: it hung for good before
    assert done.returncode == 1, done.stderr  # the exception's own exit, once its flush is done
