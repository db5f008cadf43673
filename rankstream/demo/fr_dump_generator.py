"""Synthetic NCCL-style Flight Recorder dumps, for benchmarks and tests at any scale.

``write_dumps(directory, ranks, entries)`` writes one pickle per rank laid out as torch 2.x writes
them (``version``, ``pg_config`` with ranks as JSON text, ``pg_status``, ``entries`` with every field
and short stack frames). The job: tensor-parallel groups of ``tp`` ranks (sequence-parallel
all-gather and reduce-scatter around every layer), data-parallel groups across them (a gradient
all-reduce per step) and the default group (a barrier every few steps), optionally with p2p
send/recv between pipeline neighbours. Each rank keeps the last ``entries`` records, as a ring
buffer that has wrapped does. ``fault`` makes ``fault_rank`` deviate at about two thirds of its
buffer: ``wrong_op``, ``wrong_size``, ``skip`` or ``hang`` (it never issues its last collective).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

__all__ = ["write_dumps", "FAULTS"]

FAULTS = ("none", "wrong_op", "wrong_size", "skip", "hang")
_FRAMES = [{"name": "forward", "filename": "model.py", "line": 120},
           {"name": "train_step", "filename": "train.py", "line": 42}]


def _groups(ranks: int, tp: int) -> dict[str, dict]:
    groups = {"0": {"name": "0", "desc": "default_pg", "ranks": list(range(ranks))}}
    for block in range(ranks // tp):
        groups[str(1 + block)] = {"name": str(1 + block), "desc": "tp", "ranks": list(range(block * tp, (block + 1) * tp))}
    base = 1 + ranks // tp
    for index in range(tp):
        groups[str(base + index)] = {"name": str(base + index), "desc": "dp", "ranks": list(range(index, ranks, tp))}
    return groups


def _step_ops(layers: int) -> list[tuple[str, str, list[int], list[int]]]:
    """(group kind, op, input shape, output shape per member count placeholder) for one step."""
    ops = []
    for _ in range(layers):
        ops += [("tp", "_all_gather_base", [1024, 4096], [-1, 4096]), ("tp", "_reduce_scatter_base", [-1, 4096], [1024, 4096])]
    ops += [("dp", "all_reduce", [8_388_608], [8_388_608])]
    return ops


def write_dumps(directory: Path, ranks: int, entries: int, *, tp: int = 8, fault: str = "none", fault_rank: int = 1,
                fault_at: float = 2 / 3,
                layers: int = 4, p2p: bool = False) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tp = min(tp, ranks)
    groups = _groups(ranks, tp)
    membership = {r: {g["desc"]: (name, g) for name, g in groups.items() if r in g["ranks"]} for r in range(ranks)}
    step_ops = _step_ops(layers)
    steps = entries // (len(step_ops) + 1) + 2
    fault_at = int(entries * fault_at)
    pg_config = {name: {"name": name, "desc": g["desc"], "ranks": json.dumps(g["ranks"])} for name, g in groups.items()}
    for rank in range(ranks):
        log, seq, record = [], {name: 0 for name in groups}, 0
        for step in range(steps):
            plan = [(kind, op, i, o) for kind, op, i, o in step_ops]
            if step % 4 == 3:
                plan.append(("default_pg", "barrier", [], []))
            elif p2p and ranks > 1:
                plan.append(("p2p", "send" if rank % 2 == 0 else "recv", [4096], [4096]))
            for kind, op, shape_in, shape_out in plan:
                if kind == "p2p":
                    peer = rank + 1 if rank % 2 == 0 else rank - 1
                    if peer >= ranks:
                        continue
                    name, group = "0", groups["0"]
                    label = f"nccl:{op} {rank}->{peer}" if op == "send" else f"nccl:{op} {rank}<-{peer}"
                    log.append(dict(_entry(record, group, name, 0, label, shape_in, shape_out, step), is_p2p=True,
                                    p2p_seq_id=step + 1))
                    record += 1
                    continue
                name, group = membership[rank][kind] if kind != "default_pg" else ("0", groups["0"])
                size = len(group["ranks"])
                shape_in = [size * 1024 if d == -1 else d for d in shape_in]
                shape_out = [size * 1024 if d == -1 else d for d in shape_out]
                position = len(log)
                if rank == fault_rank and position == fault_at:
                    if fault == "skip":
                        fault = "done"
                        continue
                    if fault == "wrong_op":
                        op, fault = "broadcast", "done"
                    elif fault == "wrong_size":
                        shape_in, shape_out, fault = [s * 2 for s in shape_in], [s * 2 for s in shape_out], "done"
                seq[name] += 1
                log.append(_entry(record, group, name, seq[name], f"nccl:{op}", shape_in, shape_out, step))
                record += 1
        log = log[:entries + 1] if len(log) > entries else log
        if fault == "hang" and rank == fault_rank:
            log = log[:-1]
        kept = log[-entries:]
        dump = {"version": "2.10", "comm_lib_version": "2.21.5", "pg_config": pg_config,
                "pg_status": {}, "entries": kept}
        (directory / f"rank_{rank}").write_bytes(pickle.dumps(dump))
    return directory


def _entry(record: int, group: dict, name: str, seq: int, profiling_name: str, shape_in, shape_out, step: int) -> dict:
    created = 1_700_000_000_000_000_000 + step * 50_000_000 + record * 10_000
    return {
        "frames": _FRAMES, "record_id": record, "pg_id": int(name), "process_group": (name, group["desc"]),
        "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": profiling_name,
        "time_created_ns": created, "input_sizes": [shape_in] if shape_in else [], "input_dtypes": ["BFloat16"],
        "output_sizes": [shape_out] if shape_out else [], "output_dtypes": ["BFloat16"], "state": "completed",
        "time_discovered_started_ns": created + 1000, "time_discovered_completed_ns": created + 50_000,
        "retired": True, "timeout_ms": 600_000, "is_p2p": False, "thread_name": "pt_main_thread",
        "thread_id": 140000000000000,
    }
