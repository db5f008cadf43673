"""The demo's training job: a real gloo job on CPU, one process per rank, streamed by rankstream.

Each step: data loading, forward through a small MLP, an all-gather of activations inside the
rank's tensor-parallel pair, backward, a data-parallel all-reduce of the gradients over the
default group, a broadcast from rank 0 every 5 steps, and the optimizer step, all in
``rankstream.span``s, under ``rankstream.profile`` (torch.profiler on a schedule) and with the
Flight Recorder tap on.

``fault`` makes ``fault_rank`` misbehave at the middle step, as real jobs do:

* ``hang``: it skips the gradient all-reduce, so its peers wait in it until the group times out;
* ``stall``: it stops before the gradient all-reduce (stuck outside collectives, as in a dead data
  loader) for twice the collective timeout, while its peers wait in the all-reduce;
* ``desync``: it all-reduces a tensor of the wrong size (gloo aborts that process);
* ``wrong_op``: it broadcasts its gradients instead of all-reducing them;
* ``extra``: it issues an extra barrier before the gradient all-reduce;
* ``straggler``: it sleeps before every step;
* ``crash``: it is killed with SIGKILL in the middle of the step (after one quiet second, so the
  events it emitted more than a second before the kill are all that can be expected to survive);
* ``size``: it all-gathers its activations in another shape (the same number of elements, so gloo
  passes them and the job goes on, silently wrong, as a mistaken reshape does);
* ``cross_group``: it skips the all-gather in its pair, so its partner waits there while everyone
  else waits in the gradient all-reduce for the partner (the culprit is one group away).

With ``dump_flight_recorder``, every rank also writes torch's own Flight Recorder dump when the job
fails (a collective timed out) or ends, as NCCL's watchdog does on a timeout: ``<report_dir>/dumps/
rank_<r>``, for ``rankstream diagnose``. The faulty rank notes when it misbehaved (``fault_at_ns``
in its report), so a test can tell how soon a finding came.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import rankstream

FAULTS = ("none", "hang", "stall", "desync", "wrong_op", "extra", "straggler", "crash", "size", "cross_group")


@dataclass(frozen=True)
class JobSpec:
    run_id: str
    world_size: int
    steps: int
    fault: str = "none"
    fault_rank: int = 1
    master_port: int = 29500
    #: How long a peer waits in a collective that never completes (the hang and desync faults).
    collective_timeout_s: float = 20.0
    straggler_sleep_s: float = 0.15
    #: Where each rank writes a small JSON report (events emitted, the crash moment...).
    report_dir: str = ""
    #: Also write torch's own FR dump: ``report_dir/rank<r>.fr`` at the end (to check the tap
    #: against) and ``report_dir/dumps/rank_<r>`` at the end or when the job fails.
    dump_flight_recorder: bool = False
    #: Where the rank's stdout and stderr go (torch's and Kineto's chatter); empty keeps them.
    log_path: str = ""
    #: The step the fault happens in; None: the middle one.
    fault_step: int | None = None


def _tp_pairs(world_size: int):
    import torch.distributed as dist  # the demo job's own dependency, not rankstream's

    groups = {}
    for first in range(0, world_size - 1, 2):  # every rank must create every group, in order
        pair = [first, first + 1]
        groups[tuple(pair)] = dist.new_group(pair)
    return groups


def train_rank(rank: int, spec: JobSpec, environment: dict[str, str]) -> None:
    """Entry point of one rank's process."""
    if spec.log_path:
        _redirect_output(spec.log_path)
    os.environ.update(environment)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec.master_port), RANK=str(rank),
                      WORLD_SIZE=str(spec.world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(spec.world_size),
                      GROUP_RANK="0")
    import torch  # the demo job's own dependency, not rankstream's
    import torch.distributed as dist

    session = rankstream.init(run_id=spec.run_id, fr_interval_s=0.5, clock_sync_interval_s=10.0)
    dist.init_process_group("gloo", timeout=timedelta(seconds=spec.collective_timeout_s))
    pairs = _tp_pairs(spec.world_size)
    my_pair = next((g for ranks, g in pairs.items() if rank in ranks), None)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    faulty = spec.fault != "none" and rank == spec.fault_rank
    middle = spec.steps // 2 if spec.fault_step is None else spec.fault_step
    report: dict = {"rank": rank}
    if faulty:
        rankstream.instant("fault_injection_armed", fault=spec.fault, step=middle)
    try:
        with rankstream.profile(wait=1, warmup=1, active=2, repeat=0, record_shapes=True, profile_memory=True) as prof:
            for step in range(spec.steps):
                rankstream.step(step)
                if faulty and step == middle:
                    report["fault_at_ns"] = time.time_ns()
                    _write_report(spec, report)
                if faulty and spec.fault == "straggler":
                    time.sleep(spec.straggler_sleep_s)
                with rankstream.span("data"):
                    inputs, targets = torch.randn(32, 64), torch.randint(0, 10, (32,))
                with rankstream.span("forward"):
                    hidden = model[1](model[0](inputs))
                    if my_pair is not None and not (faulty and step == middle and spec.fault == "cross_group"):
                        with rankstream.span("tp_all_gather"):
                            sent = hidden.detach()
                            if faulty and step == middle and spec.fault == "size":
                                sent = sent.reshape(sent.shape[1], sent.shape[0]).contiguous()
                            gathered = [torch.empty_like(sent) for _ in range(2)]
                            dist.all_gather(gathered, sent, group=my_pair)
                    loss = torch.nn.functional.cross_entropy(model[2](hidden), targets)
                if faulty and spec.fault == "crash" and step == middle:
                    report["emitted_1s_before_kill"] = session.producer.stats().events_emitted
                    _write_report(spec, report)
                    time.sleep(1.0)
                    os.kill(os.getpid(), signal.SIGKILL)
                with rankstream.span("backward"):
                    optimizer.zero_grad()
                    loss.backward()
                if faulty and spec.fault == "stall" and step == middle:
                    with rankstream.span("stuck_in_data_loader"):
                        time.sleep(spec.collective_timeout_s * 2)
                with rankstream.span("allreduce"):
                    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
                    if faulty and step == middle and spec.fault == "hang":
                        rankstream.instant("skipped_allreduce", step=step)
                    elif faulty and step == middle and spec.fault == "desync":
                        dist.all_reduce(grads[: grads.numel() // 2].contiguous())
                    elif faulty and step == middle and spec.fault == "wrong_op":
                        dist.broadcast(grads, src=0)
                    else:
                        if faulty and step == middle and spec.fault == "extra":
                            dist.barrier()
                        dist.all_reduce(grads)
                if step % 5 == 0:
                    flag = torch.tensor([float(step)])
                    dist.broadcast(flag, src=0)
                with rankstream.span("optimizer"):
                    optimizer.step()
                rankstream.counter("loss", {"value": float(loss.detach())})
                prof.step()
        report["completed"] = True
        if spec.dump_flight_recorder and spec.report_dir:
            Path(spec.report_dir, f"rank{rank}.fr").write_bytes(_flight_recorder_dump())
    except Exception as exc:  # a peer hung or died: the collective timed out; record it and leave
        report["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
        rankstream.instant("training_failed", error=report["error"])
    if spec.dump_flight_recorder and spec.report_dir:
        dumps = Path(spec.report_dir, "dumps")
        dumps.mkdir(exist_ok=True)
        (dumps / f"rank_{rank}").write_bytes(_flight_recorder_dump())
    rankstream.shutdown(timeout_s=15)
    report["events_emitted"] = session.producer.stats().events_emitted
    _write_report(spec, report)
    try:
        dist.destroy_process_group()
    except Exception as exc:  # a peer died: nothing left to tear down, but say so in the log
        print(f"rank {rank}: destroy_process_group failed: {exc}", file=sys.stderr)


def _redirect_output(log_path: str) -> None:
    """Send file descriptors 1 and 2 to ``log_path``: Kineto and gloo write there from C++,
    below Python's ``sys.stdout``."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def _flight_recorder_dump() -> bytes:
    """torch's dump of this rank's ring, without stack traces (which would block while a gloo
    collective hangs)."""
    from torch._C._distributed_c10d import _dump_fr_trace  # the demo job's own dependency

    return _dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)


def start_job(spec: JobSpec, environment: dict[str, str]) -> list:
    """Start one process per rank (spawned, so each is a fresh interpreter); returns them."""
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=train_rank, args=(rank, spec, environment), name=f"rank{rank}")
                 for rank in range(spec.world_size)]
    for process in processes:
        process.start()
    return processes


def read_reports(report_dir: str) -> dict[int, dict]:
    """The ranks' JSON reports from ``JobSpec.report_dir``, by rank."""
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in Path(report_dir).glob("rank*.json")}


def _write_report(spec: JobSpec, report: dict) -> None:
    if spec.report_dir:
        Path(spec.report_dir, f"rank{report['rank']}.json").write_text(json.dumps(report))
