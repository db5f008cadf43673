"""A rank's rankstream session: its producer, Flight Recorder tap, clock sync and step counter.

One session per process (``rankstream.init`` creates it). It takes a final FR snapshot and
flushes the producer when the process ends: normally (``atexit``), on an uncaught exception
(``sys.excepthook``) and on SIGTERM/SIGINT (the previous handlers still run afterwards).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import uuid
from typing import Any

from rankstream.schemas.config import Config
from rankstream.schemas.processes import start_ticks
from rankstream.schemas.settings import LaunchEnvironment, flight_recorder_buffer_size
from rankstream.schemas.stack_frames import frame_records
from rankstream.schemas.topics import requests_topic
from rankstream.producers.clock_sync import ClockRounds
from rankstream.producers.flight_recorder import FlightRecorderTap
from rankstream.producers.on_demand import OnDemandWindows
from rankstream.producers.producer import Producer
from rankstream.producers.profiler import ProfilerStream
from rankstream.producers.requests import RequestListener
from rankstream.producers.signal_watch import SignalWatch
from rankstream.producers.transfer_count import install as install_transfer_count

__all__ = ["RankSession", "resolve_identity"]


def _dist():
    try:
        import torch.distributed as dist  # torch is the job's, not a dependency
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def resolve_identity(run_id: str | None, rank: int | None, world_size: int | None,
                     *, launch: LaunchEnvironment) -> tuple[str, int, int]:
    """Who this rank is: explicit arguments, then the process group, then the launcher's variables.

    Every launch gets a run id of its own, which all its ranks share. In order: the argument,
    RANKSTREAM_RUN_ID or torchrun's rendezvous id; else one that rank 0 proposes through a store
    every rank reads back (the process group's, or torchrun's agent store before there is a group);
    else the launcher's job id (SLURM, PMIx); else the master address and the launching process,
    which the ranks of one single-node launch share. Rank 0 prints it once.
    """
    dist = _dist()
    if rank is None:
        rank = dist.get_rank() if dist else (launch.rank if launch.rank is not None else 0)
    if world_size is None:
        world_size = dist.get_world_size() if dist else (launch.world_size or 1)
    if run_id is None and launch.run_id and launch.run_id != "none":
        run_id = launch.run_id
    if run_id is None:
        run_id = _agreed_run_id(dist, launch, rank)
        if rank == 0:
            print(f"rankstream: run id {run_id}", file=sys.stderr, flush=True)
    return run_id, rank, world_size


#: The key under which rank 0's proposed run id is kept in the launch's store.
RUN_ID_KEY = "rankstream/run_id"
#: How long a rank waits for torchrun's agent store before falling back to the other sources.
AGENT_STORE_TIMEOUT_S = 10


def _agreed_run_id(dist, launch: LaunchEnvironment, rank: int) -> str:
    """A run id every rank of this launch computes alike, and no other launch does: rank 0's
    proposal, which the other ranks read from the store."""
    proposal = launch.run_proposal or f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    store = None
    try:
        if dist is not None:
            store = dist.distributed_c10d._get_default_store()
        elif launch.agent_store and launch.master:
            from datetime import timedelta

            import torch.distributed as torch_dist  # torch is the job's, not a dependency

            host, port = launch.master.rsplit(":", 1)
            store = torch_dist.TCPStore(host, int(port), is_master=False,
                                        timeout=timedelta(seconds=AGENT_STORE_TIMEOUT_S))
        if store is not None:
            if rank == 0:
                return store.compare_set(RUN_ID_KEY, "", proposal).decode()
            return store.get(RUN_ID_KEY).decode()  # waits for rank 0 (up to the store's timeout)
    except Exception:  # no store, or it refused: the run id comes from the launch environment
        pass
    if launch.run_proposal:  # `rankstream run` on this node chose it
        return launch.run_proposal
    if launch.launcher_job:
        return f"job-{launch.launcher_job}"
    master = (launch.master or "local").replace(":", "-")
    return f"job-{master}-{_launching_process()}"


def _launching_process() -> str:
    """The parent process as ``<pid>.<start time>``: the ranks one launcher started on this node
    share it, and a later launch (even reusing the pid) does not."""
    parent = os.getppid()
    started = start_ticks(parent)
    return f"{parent}.{started if started is not None else time.strftime('%Y%m%d')}"


#: At shutdown, how long a clock-sync round still running may take to finish and send its sample.
CLOCK_ROUND_GRACE_S = 2.0
#: After a failed clock-sync round, the first retry comes this soon (then 2x, 4x... up to the interval).
CLOCK_RETRY_S = 1.0


def _raised_at(traceback) -> list[dict]:
    """The stack where an exception was raised (innermost frame first), as the tap records stacks."""
    if traceback is None:
        return []
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    return frame_records(traceback.tb_frame)


class RankSession:
    def __init__(self, *, run_id: str, rank: int, world_size: int, config: Config, launch: LaunchEnvironment,
                 metadata: dict | None = None, fr_tap: bool = True, fr_interval_s: float = 1.0,
                 fr_full_every_s: float = 1.0,
                 clock_sync: bool = True, clock_sync_interval_s: float = 60.0, clock_sync_timeout_s: float = 10.0,
                 producer: Producer | None = None, requests: bool = False) -> None:
        self.run_id, self.rank, self.world_size = run_id, rank, world_size
        self.producer = producer or Producer(run_id=run_id, rank=rank, world_size=world_size, config=config,
                                             metadata=metadata)
        self.step: int | None = None
        self.pid = os.getpid()
        self.clock_failures = 0
        self.clock_samples = 0
        self._stop = threading.Event()
        self._closed = False
        self._exit_gate = threading.Lock()  # held from the first emergency flush on
        self._profiler_streams: list[ProfilerStream] = []
        #: Windows ``rankstream profile`` asks for, read from the bus when ``requests`` is on.
        self.windows = OnDemandWindows(self.producer, self.pid, self.profiler_stream)
        #: True while another profiler of this process records (``rankstream run``'s periodic
        #: windows): a requested window then waits for the next boundary, as Kineto runs one at a time.
        self.other_profiler_busy = lambda: False
        if requests:
            self.producer.follow(requests_topic(config.topic_prefix),
                                 RequestListener(run_id, rank=rank, on_request=self.windows.request).received)
        self.producer.emit_rank_metadata(local_rank=launch.local_rank, node_rank=launch.node_rank,
                                         local_world_size=launch.local_world_size, **_versions())
        self.tap = FlightRecorderTap(self.producer, interval_s=fr_interval_s, full_every_s=fr_full_every_s,
                                     ring_size=flight_recorder_buffer_size() or 2000,
                                     groups=process_groups_now) if fr_tap else None
        if self.tap:
            self.tap.start()
        #: gloo records no transfer in the Flight Recorder: the heartbeats count them instead.
        self._uncount_transfers = install_transfer_count(self.producer.count_transfer) if fr_tap else None
        self._groups_sent = False
        self._clock_interval = clock_sync_interval_s
        self._clock_timeout = clock_sync_timeout_s
        self._clock_thread = None
        if clock_sync and world_size > 1:
            self._clock_thread = threading.Thread(target=self._clock_loop, name="rankstream-clock", daemon=True)
            self._clock_thread.start()
        self._install_hooks()

    # -- steps and profiler -----------------------------------------------------------------------
    def on_step(self) -> None:
        """At a step boundary (``rankstream.step()``): open, advance or close a requested window."""
        self.windows.on_step(self.step, wait=self.other_profiler_busy())

    def profiler_stream(self, then=None) -> ProfilerStream:
        stream = ProfilerStream(self.producer, self.rank, then=then)
        self._profiler_streams.append(stream)
        return stream

    # -- clock sync and process groups ------------------------------------------------------------
    def _clock_loop(self) -> None:
        rounds = None
        retry_s = CLOCK_RETRY_S
        while not self._stop.is_set():
            dist = _dist()
            if dist is None:  # the process group does not exist yet: look again soon
                self._stop.wait(0.5)
                continue
            self._send_groups(dist)
            try:
                rounds = rounds or ClockRounds(dist.distributed_c10d._get_default_store(), self.run_id,
                                               self.world_size, timeout_s=self._clock_timeout)
                sample = rounds.sample()
                self.producer.emit_rank_metadata(clock_sync_ns=sample.sync_ns, clock_error_ns=sample.error_ns,
                                                 clock_round=sample.round)
                self.clock_samples += 1
                retry_s = CLOCK_RETRY_S
                self._stop.wait(self._clock_interval)
            except Exception as exc:  # a peer did not join within the timeout, or the store is gone
                self.clock_failures += 1
                failure = {"round": rounds.round if rounds else None, "error": str(exc)[:300]}
                self.producer.emit("clock_sync_failed", "rankstream", "i", ts_ns=time.time_ns(), dur_ns=0,
                                   pid=self.pid, tid=0, step=self.step, flow_id=None,
                                   correlation_id=None, args=failure)
                # retry soon, so a short job still gets a sample, backing off while peers stay away
                self._stop.wait(min(retry_s, self._clock_interval))
                retry_s *= 2

    def _send_groups(self, dist) -> None:
        if self._groups_sent:
            return
        self._groups_sent = True
        try:
            groups = process_groups_now()
            if groups:
                self.producer.emit_process_groups(groups)
            self.producer.emit_rank_metadata(backend=dist.get_backend())
        except Exception as exc:  # the groups are optional metadata: the failure is stored as an event
            self.producer.emit("rankstream_error", "rankstream", "i", ts_ns=time.time_ns(),
                               args={"where": "process groups", "error": f"{type(exc).__name__}: {exc}"[:300]})

    # -- shutdown ---------------------------------------------------------------------------------
    def shutdown(self, timeout_s: float | None = None) -> None:
        """Final FR snapshot, convert pending profiler windows, flush the producer. Idempotent."""
        if self._closed or os.getpid() != self.pid:  # a forked child's exit is not the rank's
            return
        self._closed = True
        self._stop.set()
        if self._clock_thread is not None:
            # A round between its barriers when training ends (a short job, a loaded machine) has
            # peers that finished it: its sample is a moment away and would be emitted after the
            # producer closed. A round whose peers are gone gives up after the grace.
            self._clock_thread.join(min(self._clock_timeout, CLOCK_ROUND_GRACE_S))
        if self.tap:
            self.tap.stop(final_snapshot=True)
        if self._uncount_transfers is not None:
            self._uncount_transfers()
        self.windows.close()
        for stream in self._profiler_streams:
            stream.flush(timeout_s=10)
        self.producer.close(timeout_s)

    def emergency_flush(self, reason: str, frames: list[dict] | None = None) -> bool:
        """On a crash path: snapshot FR and push what is buffered, without closing anything. Only
        the first call works; a later one returns False at once: it is a signal that came during
        the first (torchrun's SIGTERM while an exception's flush reads the ring), and the path that
        is flushing ends the process. Waiting for it there deadlocked the rank on the tap's lock."""
        if os.getpid() != self.pid:  # a forked child (a DataLoader worker): the rank's streams are not its own
            return False
        if not self._exit_gate.acquire(blocking=False):  # taken once, never released; never waits
            return False
        try:
            self.producer.emit("process_exit", "rankstream", "i", ts_ns=time.time_ns(), dur_ns=0, pid=self.pid, tid=0,
                               step=self.step, flow_id=None, correlation_id=None,
                               args={"reason": reason, **({"frames": frames} if frames else {})})
            if self.tap:
                self.tap.snapshot(full=True)
            self.producer.flush(timeout_s=3.0)
        except Exception:  # the process is already dying: what was buffered is all that can be saved
            pass
        return True

    def _install_hooks(self) -> None:
        atexit.register(self.shutdown)
        previous_hook = sys.excepthook

        def excepthook(kind, value, traceback):
            # where it was raised: inside a torch.distributed call the Flight Recorder may not show
            self.emergency_flush(f"uncaught {kind.__name__}: {exception_text(value)}"[:300], _raised_at(traceback))
            previous_hook(kind, value, traceback)

        sys.excepthook = excepthook
        if threading.current_thread() is not threading.main_thread():
            return
        watch = SignalWatch(self.emergency_flush)
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(signum)

            def handler(number, frame, previous=previous):
                watch.handled(number)
                if not self.emergency_flush(f"signal {signal.Signals(number).name}"):
                    return  # a flush under way ends the process when it is done
                if callable(previous):
                    previous(number, frame)
                elif previous == signal.SIG_DFL:
                    signal.signal(number, signal.SIG_DFL)
                    os.kill(os.getpid(), number)

            handler.rankstream_previous = previous  # what a forked child goes back to
            try:
                signal.signal(signum, handler)
            except (ValueError, OSError):
                continue
            if signum == signal.SIGTERM and previous == signal.SIG_DFL:
                watch.install()


def exception_text(value: BaseException) -> str:
    """An exception's message on one line: its first line, and its last when it has several. A
    DataLoader worker's error is re-raised as "Caught ValueError in DataLoader worker process 0."
    followed by the worker's traceback, whose last line holds what actually went wrong."""
    lines = [line.strip() for line in str(value).splitlines() if line.strip()]
    if len(lines) > 1:
        return f"{lines[0]} ... {lines[-1]}"
    return lines[0] if lines else ""


def _signals_as_before_rankstream() -> None:
    """In a forked child (a DataLoader worker, a pool's worker), which is not the rank: its SIGTERM
    and SIGINT do what they did before rankstream, so terminating it flushes nothing and ends only it."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        handler = installed = signal.getsignal(signum)
        while hasattr(handler, "rankstream_previous"):
            handler = handler.rankstream_previous
        if handler is not installed and handler is not None:  # None: set outside Python, nothing to go back to
            try:
                signal.signal(signum, handler)
            except (ValueError, OSError):  # forked from a thread that is not the main one
                pass


os.register_at_fork(after_in_child=_signals_as_before_rankstream)


def process_groups_now() -> list[dict[str, Any]]:
    """The process's process groups as torch lists them (none before ``init_process_group``)."""
    dist = _dist()
    if dist is None:
        return []
    backend = dist.get_backend()
    groups = []
    for config in dist.distributed_c10d._get_all_pg_configs():
        ranks = config.get("ranks")
        groups.append({"pg_name": str(config.get("pg_name")), "pg_desc": config.get("pg_desc"),
                       "ranks": list(ranks) if ranks else None, "backend": str(config.get("backend") or backend)})
    return groups


def _versions() -> dict[str, Any]:
    try:
        import torch  # torch is the job's, not a dependency

        return {"torch_version": torch.__version__}
    except ImportError:
        return {}
