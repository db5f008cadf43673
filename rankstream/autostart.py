"""Capture inside a job nobody edited: what ``rankstream run``'s bootstrap does in each process.

``install()`` (the bootstrap's only call, at interpreter start) imports nothing heavy: it waits
for torch to load ``torch.distributed.distributed_c10d`` and wraps its ``init_process_group``.
When a process creates its process group, and only then, rankstream starts there
(:func:`start_rank`): the session (producer, Flight Recorder tap, clock sync), one step mark per
training iteration from the optimizers' step hook, the periodic profiler windows ``run`` asked
for, and a watcher that writes Flight Recorder dumps and Python stacks when ``run`` asks.
Launcher agents and DataLoader workers never create a group, so they never start anything.

Nothing here may break the job: every failure becomes one line on stderr.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
import threading

__all__ = ["install", "start_rank", "IterationMarks"]

_C10D = "torch.distributed.distributed_c10d"


def install() -> None:
    """Wrap ``init_process_group`` as soon as torch defines it (at once if it already has)."""
    if _C10D in sys.modules:
        _wrap(sys.modules[_C10D])
    elif not any(isinstance(finder, _C10dFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _C10dFinder())


class _C10dFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when torch imports distributed_c10d, it has the usual finders load
    it and wraps ``init_process_group`` before anything else can import the name."""

    def find_spec(self, name, path=None, target=None):
        if name != _C10D:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _wrap(module)

        spec.loader.exec_module = exec_module
        return spec


def _wrap(c10d) -> None:
    original = c10d.init_process_group
    if getattr(original, "__rankstream__", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        _start_quietly()
        return result

    init_process_group.__rankstream__ = True
    c10d.init_process_group = init_process_group


_started = False


def _start_quietly() -> None:
    global _started
    if _started:
        return
    _started = True
    try:
        start_rank()
    except Exception as exc:  # the job goes on without capture, and says so once
        print(f"rankstream: not capturing this rank: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


class IterationMarks:
    """An optimizer step hook that marks one step per training iteration.

    torch calls the hook once per ``optimizer.step()``. With several optimizers, an iteration
    ends when an optimizer that already stepped in it steps again; optimizers created later (a
    new one per epoch) join in without a special case. An optimizer stepping several times in a
    row while another one steps too (a GAN's critic, stepped five times per generator step) is
    one iteration: a repeat of the previous step starts one only when no other optimizer stepped
    in the last ``RECENT_CALLS`` steps (a lone optimizer, or one that replaced another)."""

    #: Steps after which an optimizer that stopped stepping no longer counts as another one.
    RECENT_CALLS = 16

    def __init__(self, on_iteration) -> None:
        self._seen: set[int] = set()
        self._on_iteration = on_iteration
        self._calls, self._previous = 0, None
        self._other_at = 0  # the last step another optimizer took before the current run of one (0: none)

    def __call__(self, optimizer, args=None, kwargs=None) -> None:
        key = id(optimizer)
        self._calls += 1
        if key != self._previous:
            self._other_at = self._calls - 1
        in_a_row = key == self._previous and self._other_at > 0 and self._calls - self._other_at <= self.RECENT_CALLS
        self._previous = key
        if not self._seen or (key in self._seen and not in_a_row):
            self._seen = {key}
            try:
                self._on_iteration()
            except Exception:  # a step mark is never worth a training step
                pass
        else:
            self._seen.add(key)


def start_rank():
    """Start rankstream in this process, whose process group was just created."""
    import atexit
    import warnings

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from rankstream import api
    from rankstream.producers.profiler import job_activities, periodic_windows
    from rankstream.schemas.settings import run_options

    session = api.init()
    if session is None:  # RANKSTREAM_DISABLED
        return None
    options = run_options()
    profiler = None
    if options.profile_every and options.profile_active:
        # torch warns at each window after the first that it dropped the previous one: that is the design
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events", category=UserWarning)
        profiler = api.profile(schedule=periodic_windows(options.profile_every, options.profile_active),
                               activities=job_activities())
        profiler.start()
        session.other_profiler_busy = lambda: profiler.current_action != torch.profiler.ProfilerAction.NONE
        atexit.register(_stop_profiler, profiler)  # runs before the session's own exit hook (registered earlier)

    # Iteration k ends at the k-th optimizer step, where step k + 1 starts: the numbers match the
    # profiler's ProfilerStep#k. Step 0's start is not seen (it is not a step time), but its events
    # carry its number.
    session.step = 0

    def on_iteration() -> None:
        api.after_optimizer_step()
        if profiler is not None and not session.windows.active:  # one profiler at a time: a requested window first
            profiler.step()

    register_optimizer_step_post_hook(IterationMarks(on_iteration))
    if options.run_dir is not None:
        _tell_the_launcher(options.run_dir, session.run_id)
        _report_fatal_errors(options.run_dir, session.rank)
        threading.Thread(target=_answer_dump_requests, args=(options.run_dir, session.rank),
                         name="rankstream-dumps", daemon=True).start()
    return session


#: Where a rank's ``faulthandler`` writes, in the run's directory, for ``run``'s verdict.
FATAL_REPORT = "fatal_rank{rank}.txt"
_fatal_report = None  # the open file faulthandler writes to: kept for the process's life


def _report_fatal_errors(run_dir, rank: int) -> None:
    """A crash in native code (a SIGSEGV, gloo's abort on mismatched data) ends the rank before it
    can say a word: ``faulthandler`` then writes the error and the stacks to the run's directory,
    where ``run`` reads them. A job that set ``faulthandler`` up itself keeps its own."""
    import faulthandler

    global _fatal_report
    if faulthandler.is_enabled():
        return
    try:
        _fatal_report = open(run_dir / FATAL_REPORT.format(rank=rank), "w")
        faulthandler.enable(file=_fatal_report)
    except (OSError, ValueError) as exc:  # no report of a crash, the job goes on as it would have
        print(f"rankstream: rank {rank} cannot report fatal errors: {exc}", file=sys.stderr)


def _stop_profiler(profiler) -> None:
    try:
        profiler.stop()  # a window still open is streamed
    except Exception as exc:  # at exit: said once, the job ends as it would have
        print(f"rankstream: the last profiler window was lost: {type(exc).__name__}: {exc}", file=sys.stderr)


#: The ranks write the run id they agreed on in this file of the run's directory: ``run`` proposed
#: one, but on a node without rank 0 another node's proposal wins.
AGREED_RUN_ID = "run_id"


def _tell_the_launcher(run_dir, run_id: str) -> None:
    """Write the agreed run id for ``run`` (every rank of the node writes the same text)."""
    from rankstream.schemas.files import write_atomically

    try:
        write_atomically(run_dir / AGREED_RUN_ID, run_id)
    except OSError as exc:  # the launcher then keeps its own proposal; the capture goes on
        print(f"rankstream: cannot tell `run` the run id in {run_dir}: {exc}", file=sys.stderr)


#: ``run --on-hang dump`` writes this file in the run's directory; every rank answers each new one.
DUMP_REQUEST = "dump.request"


def _answer_dump_requests(run_dir, rank: int, poll_s: float = 0.5) -> None:
    """Write this rank's Flight Recorder dump and Python stacks for each request, from this thread:
    the main thread may be stuck in a collective (torch releases the GIL while it waits)."""
    import faulthandler
    import json
    import time

    import torch

    from rankstream.schemas.stack_frames import frame_records

    request = run_dir / DUMP_REQUEST
    answered = None
    while True:
        time.sleep(poll_s)
        try:
            name = request.read_text().strip()
        except OSError:
            continue
        if not name or name == answered:
            continue
        answered = name
        folder = run_dir / name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / f"stacks_rank{rank}.txt", "w") as stacks:
                faulthandler.dump_traceback(stacks, all_threads=True)
            # the main thread's frames again, with the peers its torch.distributed call names
            main = sys._current_frames().get(threading.main_thread().ident)
            (folder / f"stacks_rank{rank}.json").write_text(json.dumps(frame_records(main)))
            # the JSON dump returns at once during a hung collective; the pickled one may wait for the timeout
            dump = torch._C._distributed_c10d._dump_fr_trace_json()
            # named as torch names its dumps (no suffix), for `rankstream diagnose DIR --prefix rank_`
            (folder / f"rank_{rank}").write_bytes(dump if isinstance(dump, bytes) else dump.encode())
        except Exception as exc:  # a full disk or a refused dump: said, the next request tries again
            print(f"rankstream: rank {rank} could not write its dump: {type(exc).__name__}: {exc}", file=sys.stderr)
