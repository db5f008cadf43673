"""Per-rank trace files for the analysis benchmark, written as text (fast, any size).

* ``write_composer_trace``: what Composer's JSONTraceHandler writes per rank: a JSON array with the
  rank and clock-sync metadata first, then profiler ops (X), Composer duration (B/E) and instant
  events and counters, about 200 bytes per event.
* ``write_kineto_trace``: a torch.profiler / Kineto export (``traceEvents``, ``baseTimeNanoseconds``,
  ``distributedInfo``) with CPU ops, ``ProfilerStep#N`` spans and GPU kernels on a stream, which is
  what Holistic Trace Analysis needs for its breakdowns.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

__all__ = ["write_composer_trace", "write_kineto_trace"]

_OPS = ("aten::linear", "aten::addmm", "aten::relu", "aten::matmul", "aten::layer_norm", "aten::softmax",
        "aten::mm", "aten::threshold_backward", "aten::sum", "AddmmBackward0")


def write_composer_trace(path: Path, rank: int, target_bytes: int, skew_us: int = 0, seed: int = 0) -> int:
    """Write about ``target_bytes``; returns the number of events."""
    rng = random.Random(seed + rank)
    start_us = 1_700_000_000_000_000 + skew_us
    lines = [
        {"name": "process_name", "ph": "M", "ts": start_us, "pid": rank, "tid": 1000, "args": {"name": f"Rank {rank} training loop process"}},
        {"name": "thread_name", "ph": "M", "ts": start_us, "pid": rank, "tid": 1000, "args": {"name": "Training Loop"}},
        {"name": "global_rank", "ph": "M", "ts": start_us, "pid": rank, "tid": 1000, "args": {"value": rank}},
        {"name": "process_sort_index", "ph": "M", "ts": start_us, "pid": rank, "tid": 1000, "args": {"sort_index": rank}},
        {"name": "clock_sync_timestamp_us", "ph": "M", "ts": start_us, "pid": rank, "tid": 1000, "args": {"value": start_us + 5}},
        {"name": "clock_sync_error_bound", "ph": "M", "ts": start_us, "pid": rank, "tid": 1000, "args": {"value": 40}},
    ]
    written, events, now, batch = 0, 0, start_us + 10, 0
    with open(path, "w") as out:
        out.write("[\n" + ",\n".join(json.dumps(e) for e in lines))
        events += len(lines)
        while written < target_bytes:
            chunk = []
            chunk.append(f'{{"name": "batch", "cat": "event", "ph": "B", "ts": {now}, "pid": {rank}, "tid": 1000, '
                         f'"args": {{"epoch": 0, "batch": {batch}}}}}')
            for i in range(400):
                dur = rng.randint(5, 400)
                op = _OPS[i % len(_OPS)]
                chunk.append(f'{{"ph": "X", "cat": "cpu_op", "name": "{op}", "pid": {rank}, "tid": 1001, "ts": {now}, '
                             f'"dur": {dur}, "args": {{"External id": {events + i}, "Input Dims": [[64, 512], [512, 512]], '
                             f'"Input type": ["float", "float"]}}}}')
                now += dur + 3
            chunk.append(f'{{"name": "loss", "cat": "metric", "ph": "C", "ts": {now}, "pid": {rank}, "tid": 1000, '
                         f'"args": {{"value": {rng.random():.5f}}}}}')
            chunk.append(f'{{"name": "batch", "cat": "event", "ph": "E", "ts": {now}, "pid": {rank}, "tid": 1000, '
                         f'"args": {{"epoch": 0, "batch": {batch}}}}}')
            text = ",\n" + ",\n".join(chunk)
            out.write(text)
            written += len(text)
            events += len(chunk)
            batch += 1
            now += 50
        out.write("\n]\n")
    return events


def write_kineto_trace(path: Path, rank: int, world_size: int, events: int, seed: int = 0) -> int:
    """Write about ``events`` events (half CPU ops, half GPU kernels); returns the number written."""
    rng = random.Random(seed + rank)
    base_ns = 1_700_000_000_000_000_000
    header = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "synthetic", "totalGlobalMem": 1 << 34}],
              "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
              "baseTimeNanoseconds": base_ns}
    count, step, now = 0, 0, 1000.0
    with open(path, "w") as out:
        out.write(json.dumps(header)[:-1] + ', "traceEvents": [\n')
        out.write(f'{{"ph": "M", "name": "process_name", "pid": {rank}, "tid": 0, "args": {{"name": "rank {rank}"}}}}')
        while count < events:
            step_start, chunk = now, []
            for i in range(200):
                dur = rng.randint(5, 60)
                chunk.append(f'{{"ph": "X", "cat": "cpu_op", "name": "{_OPS[i % len(_OPS)]}", "pid": {rank}, "tid": 7, '
                             f'"ts": {now:.3f}, "dur": {dur}, "args": {{"External id": {count + i}, "correlation": {count + i}}}}}')
                kernel = "ncclDevKernel_AllReduce_Sum_f32_RING_LL" if i % 40 == 39 else f"void gemm_kernel_{i % 7}"
                chunk.append(f'{{"ph": "X", "cat": "kernel", "name": "{kernel}", "pid": 0, "tid": 7, '
                             f'"ts": {now + 5:.3f}, "dur": {dur}, "args": {{"device": 0, "stream": 7, '
                             f'"correlation": {count + i}, "External id": {count + i}}}}}')
                now += dur + 2
            chunk.append(f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": {rank}, "tid": 7, '
                         f'"ts": {step_start:.3f}, "dur": {now - step_start:.3f}}}')
            out.write(",\n" + ",\n".join(chunk))
            count += len(chunk)
            step += 1
            now += 20
        out.write("\n]}\n")
    return count
