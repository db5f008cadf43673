"""A synthetic rank: realistic trace events and Flight Recorder entries without torch.

Used by the demo (until the torch integration lands) and by the ingest benchmark. Each step
looks like a data-parallel step on a profiled rank: a ``ProfilerStep#N`` span, data loading,
forward and backward aten ops, gradient all-reduce on the default group, an all-gather on a
tensor-parallel subgroup, an occasional broadcast, an optimizer step and a memory counter, plus
one FR entry per collective with sizes, dtypes, state and the three timestamps.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from rankstream.producers.producer import Producer

__all__ = ["SyntheticJob", "run_synthetic_rank", "process_groups"]

_FORWARD = ("aten::linear", "aten::addmm", "aten::relu", "aten::layer_norm", "aten::softmax", "aten::matmul")
_BACKWARD = ("autograd::engine::evaluate_function: AddmmBackward0", "aten::mm", "aten::threshold_backward",
             "aten::native_layer_norm_backward", "aten::sum")


@dataclass(frozen=True)
class SyntheticJob:
    run_id: str
    world_size: int
    steps: int
    events_per_step: int
    tp_size: int = 2


def process_groups(world_size: int, tp_size: int) -> list[dict]:
    """The default group, one TP group per block of ``tp_size`` ranks and one DP group per TP index."""
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": list(range(world_size)), "backend": "gloo"}]
    for block in range(world_size // tp_size):
        ranks = list(range(block * tp_size, (block + 1) * tp_size))
        groups.append({"pg_name": str(1 + block), "pg_desc": "tp", "ranks": ranks, "backend": "gloo"})
    base = 1 + world_size // tp_size
    for index in range(tp_size):
        ranks = list(range(index, world_size, tp_size))
        groups.append({"pg_name": str(base + index), "pg_desc": "dp", "ranks": ranks, "backend": "gloo"})
    return groups


def _my_groups(groups: list[dict], rank: int) -> dict[str, dict]:
    mine = {}
    for group in groups:
        if rank in group["ranks"]:
            mine.setdefault(group["pg_desc"], group)
    return mine


def run_synthetic_rank(job: SyntheticJob, rank: int, producer: Producer, *, pace_s: float = 0.0) -> int:
    """Emit ``job.steps`` steps on ``producer``; returns the number of trace events emitted."""
    rng = random.Random(rank)
    groups = process_groups(job.world_size, job.tp_size)
    mine = _my_groups(groups, rank)
    producer.emit_process_groups(groups)
    producer.emit_rank_metadata(backend="gloo", torch_version="synthetic", local_rank=rank, node_rank=0,
                                local_world_size=job.world_size, clock_sync_ns=time.time_ns(), clock_error_ns=50_000)
    record_id = 0
    seq = {desc: 0 for desc in mine}
    emitted = 0
    pid, main_tid, comm_tid = 1000 + rank, 1, 2
    now = time.time_ns()
    ops_per_step = max(8, job.events_per_step - 6)
    for step in range(job.steps):
        step_start = now
        entries = []
        producer.emit("dataloader::next", "user_annotation", "X", ts_ns=now, dur_ns=800_000, pid=pid, tid=main_tid,
                      step=step)
        now += 800_000
        for i in range(ops_per_step):
            names = _FORWARD if i < ops_per_step // 2 else _BACKWARD
            duration = rng.randint(2_000, 40_000)
            producer.emit(names[i % len(names)], "cpu_op", "X", ts_ns=now, dur_ns=duration, pid=pid, tid=main_tid,
                          step=step, flow_id=None, correlation_id=i)
            now += duration + 500
        for desc, op, size in (("default_pg", "all_reduce", 4096), ("tp", "all_gather", 1024),
                               ("default_pg", "broadcast", 256)):
            if desc not in mine or (op == "broadcast" and step % 5):
                continue
            duration = rng.randint(200_000, 900_000) + (rank * 20_000)
            group = mine[desc]
            producer.emit(f"gloo:{op}", "kernel", "X", ts_ns=now, dur_ns=duration, pid=pid, tid=comm_tid, step=step,
                          flow_id=record_id, correlation_id=None,
                          args={"group": group["pg_name"], "seq": seq[desc]})
            out = [[size * len(group["ranks"])]] if op == "all_gather" else [[size]]
            entries.append({
                "record_id": record_id, "pg_id": int(group["pg_name"]), "pg_name": group["pg_name"],
                "pg_desc": desc, "collective_seq_id": seq[desc], "p2p_seq_id": 0, "op_id": seq[desc],
                "profiling_name": f"gloo:{op}", "time_created_ns": now - 50_000,
                "time_discovered_started_ns": now, "time_discovered_completed_ns": now + duration,
                "input_sizes": [[size]], "input_dtypes": ["Float"], "output_sizes": out, "output_dtypes": ["Float"],
                "state": "completed", "retired": True, "timeout_ms": 600_000, "is_p2p": False,
                "thread_name": "pt_main_thread", "thread_id": str(main_tid),
                "frames": [{"name": "train_step", "filename": "train.py", "line": 42}],
            })
            record_id += 1
            seq[desc] += 1
            now += duration
        producer.emit("Optimizer.step#SGD.step", "user_annotation", "X", ts_ns=now, dur_ns=300_000, pid=pid,
                      tid=main_tid, step=step)
        now += 300_000
        producer.emit("memory", "counter", "C", ts_ns=now, dur_ns=0, pid=pid, tid=main_tid, step=step, flow_id=None,
                      correlation_id=None, args={"allocated_mb": 512 + step % 7})
        producer.emit(f"ProfilerStep#{step}", "user_annotation", "X", ts_ns=step_start, dur_ns=now - step_start,
                      pid=pid, tid=main_tid, step=step)
        emitted += ops_per_step + 4 + len(entries)
        producer.emit_fr_entries(entries)
        producer.set_collectives({g["pg_name"]: {"last_enqueued": seq[d] - 1, "last_completed": seq[d] - 1}
                                  for d, g in mine.items()})
        if pace_s:
            time.sleep(pace_s)
    return emitted
