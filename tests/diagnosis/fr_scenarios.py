"""Ground-truth matrix of PyTorch Flight Recorder dump sets for the diagnosis engine.

Every scenario is one distributed training job (tensor, pipeline and data parallel process groups,
the default group) run through a small discrete-event model of how ranks really progress, then
dumped per rank the way torch 2.13 writes Flight Recorder dumps (format version "2.10"):

* ``pickle``: NCCL-shaped pickle (``_dump_fr_trace()``): states scheduled / started / completed,
  discovered times, ``duration_ms`` on retired entries, p2p send/recv entries, frames.
* ``json``: the same NCCL content as ``_dump_fr_trace_json()`` writes it: compact JSON with sorted
  keys, ``process_group`` as a list, ``0`` for unknown times, no ``frames``, ``pg_status`` values as
  strings, an empty ``nccl_comm_state``.
* ``gloo``: pickle shaped like real gloo dumps: every entry ``scheduled``, no discovered times,
  send/recv not recorded (but still counted in ``op_id``), ``pg_config`` a placeholder on some
  ranks and only the default group on others, reduce_scatter recorded as ``gloo:all_reduce`` and
  all_gather_into_tensor as ``gloo:all_gather`` with a ``[world, *input]`` output, barrier with
  empty sizes.

The fault is applied to the ranks' *programs* (skip an op, insert one, change its sizes, stop a
rank's GPU, kill a rank, ...) and the model decides what every rank's dump then contains: NCCL
ranks enqueue a whole step without waiting (the CPU blocks only at the end of the step), GPU work
runs in order per rank, a collective completes when every member has started its k-th op in the
group and the ops are byte-compatible (mismatched ones hang), p2p matches per (src, dst) channel.
The ground truth (``Expected``) is set by construction; see /work/notes/fr_scenarios.md.

Standard library only (json, pickle, random, dataclasses, pathlib); no torch, no rankstream.
"""

from __future__ import annotations

import json
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Expected",
    "Scenario",
    "KINDS",
    "LAYOUTS",
    "FORMATS",
    "scenarios",
    "scenario",
    "write_scenario",
    "dump_documents",
]

KINDS = (
    "skipped_collective",
    "extra_collective",
    "type_mismatch",
    "size_mismatch",
    "dtype_mismatch",
    "stuck_in_collective",
    "not_started",
    "missing_dump",
    "p2p_unmatched",
    "deadlock",
    "straggler",
    "state_mismatch",
)
FORMATS = ("pickle", "json", "gloo")


@dataclass(frozen=True)
class Expected:
    kind: str | None          # root-cause finding kind, None for healthy
    culprits: tuple[int, ...]  # culprit ranks (empty only for healthy or a stated reason)
    group_desc: str | None    # desc of the process group holding the root cause; None = not meaningful
    seq: int | None           # collective_seq_id (p2p_seq_id for p2p groups) of the root cause, None if not meaningful
    note: str                 # one line: why this is the right answer


@dataclass(frozen=True)
class Scenario:
    name: str
    world: int
    layout: str
    fault: str
    position: str             # "inflight" | "older" | "-"
    fmt: str                  # "pickle" | "json" | "gloo"
    culprit_dump: str         # "present" | "absent"
    expected: Expected


# --------------------------------------------------------------------------------------------
# Layouts and the job every rank runs
# --------------------------------------------------------------------------------------------

# name -> (world, tp, pp, dp, hidden, NCCL pg_config lists every group (True) or only the rank's own)
LAYOUTS: dict[str, tuple[int, int, int, int, int, bool]] = {
    "w8-tp2-dp4": (8, 2, 1, 4, 4096, False),
    "w8-tp2-pp2-dp2": (8, 2, 2, 2, 4096, True),
    "w16-tp4-dp4": (16, 4, 1, 4, 5120, False),
    "w16-tp2-pp2-dp4": (16, 2, 2, 4, 5120, True),
    "w64-tp8-dp8": (64, 8, 1, 8, 8192, False),
    "w64-tp4-pp4-dp4": (64, 4, 4, 4, 8192, True),
}

STEPS = 14                  # steps 0..13
BARRIER_STEPS = frozenset({3, 7, 11, 13})   # default-group barrier at the end of these steps (13: final)
MICROBATCHES = 2
LAYERS = 1                  # per pipeline stage (each layer: AG, RS (attention), AG, RS (MLP))
BUCKETS = 2                 # equal-size gradient buckets all-reduced over the dp group per step
BUCKET_NUMEL = 8_388_608
SEQ = 4096
T0 = 1_795_600_000_000_000_000
WATCHDOG_NS = 100_000_000   # NCCL watchdog loop (kWatchdogThreadSleepMillis = 100)
DTYPE_BYTES = {"BFloat16": 2, "Half": 2, "Float": 4, "Long": 8, "Int": 4}
MS = 1_000_000

_C10D = "/usr/local/lib/python3.11/dist-packages/torch/distributed/distributed_c10d.py"
_LOGGER = "/usr/local/lib/python3.11/dist-packages/torch/distributed/c10d_logger.py"
_SITE_FRAMES = {
    "tp_bcast": [("broadcast", _C10D, 2836), ("_broadcast_data", "megatron/core/tensor_parallel/data.py", 76),
                 ("get_batch", "pretrain_gpt.py", 117)],
    "tp_ag": [("all_gather_into_tensor", _C10D, 4413), ("_gather_along_first_dim", "megatron/core/tensor_parallel/mappings.py", 245),
              ("forward", "megatron/core/tensor_parallel/layers.py", 512)],
    "tp_rs": [("reduce_scatter_tensor", _C10D, 4540), ("_reduce_scatter_along_first_dim", "megatron/core/tensor_parallel/mappings.py", 290),
              ("forward", "megatron/core/tensor_parallel/layers.py", 861)],
    "tp_ar_nosp": [("all_reduce", _C10D, 2950), ("_reduce", "megatron/core/tensor_parallel/mappings.py", 31),
                   ("forward", "megatron/core/tensor_parallel/layers.py", 866)],
    "tp_debug": [("all_reduce", _C10D, 2950), ("check_grad_norm", "megatron/training/debug_utils.py", 58),
                 ("backward_step", "megatron/core/pipeline_parallel/schedules.py", 380)],
    "pp_send": [("send", _C10D, 2480), ("_communicate", "megatron/core/pipeline_parallel/p2p_communication.py", 330),
                ("send_forward", "megatron/core/pipeline_parallel/p2p_communication.py", 470)],
    "pp_recv": [("recv", _C10D, 2530), ("_communicate", "megatron/core/pipeline_parallel/p2p_communication.py", 330),
                ("recv_forward", "megatron/core/pipeline_parallel/p2p_communication.py", 420)],
    "dp_bucket": [("all_reduce", _C10D, 2950), ("start_grad_sync", "megatron/core/distributed/param_and_grad_buffer.py", 412),
                  ("finish_grad_sync", "megatron/core/distributed/distributed_data_parallel.py", 300)],
    "dp_zero_rs": [("reduce_scatter_tensor", _C10D, 4540), ("start_grad_sync", "megatron/core/distributed/param_and_grad_buffer.py", 405),
                   ("finish_grad_sync", "megatron/core/distributed/distributed_data_parallel.py", 300)],
    "dp_bcast": [("broadcast", _C10D, 2836), ("_sync_params", "megatron/core/distributed/distributed_data_parallel.py", 350),
                 ("finish_grad_sync", "megatron/core/distributed/distributed_data_parallel.py", 300)],
    "pp_send_grad": [("send", _C10D, 2480), ("_communicate", "megatron/core/pipeline_parallel/p2p_communication.py", 330),
                     ("send_backward", "megatron/core/pipeline_parallel/p2p_communication.py", 495)],
    "pp_recv_grad": [("recv", _C10D, 2530), ("_communicate", "megatron/core/pipeline_parallel/p2p_communication.py", 330),
                     ("recv_backward", "megatron/core/pipeline_parallel/p2p_communication.py", 445)],
    "dp_loss": [("all_reduce", _C10D, 2950), ("average_losses_across_data_parallel_group", "megatron/training/utils.py", 220),
                ("loss_func", "pretrain_gpt.py", 160)],
    "barrier": [("barrier", _C10D, 4795), ("save_checkpoint_and_time", "megatron/training/training.py", 1180)],
}


_FRAMES_CACHE: dict[str, list[dict]] = {}


def _frames(site: str) -> list[dict]:
    """Innermost frame first, as torch records them (one shared list per call site)."""
    if site not in _FRAMES_CACHE:
        _FRAMES_CACHE[site] = _make_frames(site)
    return _FRAMES_CACHE[site]


def _make_frames(site: str) -> list[dict]:
    inner = [{"name": n, "filename": f, "line": ln} for n, f, ln in _SITE_FRAMES[site]]
    return ([inner[0], {"name": "wrapper", "filename": _LOGGER, "line": 83}] + inner[1:]
            + [{"name": "train_step", "filename": "megatron/training/training.py", "line": 742},
               {"name": "pretrain", "filename": "megatron/training/training.py", "line": 355},
               {"name": "<module>", "filename": "pretrain_gpt.py", "line": 301}])


class _Job:
    """Process groups of one layout, in the order torch creates them (names "0", "1", ...)."""

    def __init__(self, layout: str):
        world, tp, pp, dp, hidden, all_groups = LAYOUTS[layout]
        self.layout, self.world, self.tp, self.pp, self.dp, self.hidden = layout, world, tp, pp, dp, hidden
        self.all_groups_in_config = all_groups
        self.groups: dict[str, tuple[str, tuple[int, ...]]] = {}   # name -> (desc, ranks)
        self.tp_of: dict[int, str] = {}
        self.dp_of: dict[int, str] = {}
        self.pp_next: dict[int, str] = {}
        self.pp_prev: dict[int, str] = {}
        self._add("default_pg", range(world))
        per_stage = tp * dp
        for st in range(pp):
            for d in range(dp):
                name = self._add("tp", [st * per_stage + d * tp + t for t in range(tp)])
                for r in self.groups[name][1]:
                    self.tp_of[r] = name
        for st in range(pp):
            for t in range(tp):
                name = self._add("dp", [st * per_stage + d * tp + t for d in range(dp)])
                for r in self.groups[name][1]:
                    self.dp_of[r] = name
        for st in range(pp - 1):
            for d in range(dp):
                for t in range(tp):
                    r = st * per_stage + d * tp + t
                    name = self._add("pp", [r, r + per_stage])
                    self.pp_next[r] = name
                    self.pp_prev[r + per_stage] = name
        self.member_groups = {r: [g for g, (_, ranks) in self.groups.items() if r in ranks] for r in range(world)}

    def _add(self, desc: str, ranks) -> str:
        name = str(len(self.groups))
        self.groups[name] = (desc, tuple(ranks))
        return name

    def stage(self, r: int) -> int:
        return r // (self.tp * self.dp)

    def coords(self, r: int) -> tuple[int, int, int]:
        """(stage, dp index, tp index)."""
        per_stage = self.tp * self.dp
        return r // per_stage, (r % per_stage) // self.tp, r % self.tp

    def rank(self, st: int, d: int, t: int) -> int:
        return st * self.tp * self.dp + d * self.tp + t

    def desc(self, g: str) -> str:
        return self.groups[g][0]


class _Op:
    __slots__ = ("group", "op", "p2p", "peer", "in_sizes", "in_dtypes", "out_sizes", "out_dtypes",
                 "dur", "cpu_gap", "gpu_gap", "sync", "site", "step", "tag", "sig")

    def __init__(self, group, op, in_sizes, in_dtypes, out_sizes, out_dtypes, dur, cpu_gap, gpu_gap, site, step, tag,
                 p2p=None, peer=-1, sync=False):
        self.group, self.op, self.p2p, self.peer = group, op, p2p, peer
        self.in_sizes, self.in_dtypes, self.out_sizes, self.out_dtypes = in_sizes, in_dtypes, out_sizes, out_dtypes
        self.dur, self.cpu_gap, self.gpu_gap, self.sync = dur, cpu_gap, gpu_gap, sync
        self.site, self.step, self.tag = site, step, tag
        self.sig = None

    def copy(self, **changes) -> "_Op":
        new = _Op(self.group, self.op, self.in_sizes, self.in_dtypes, self.out_sizes, self.out_dtypes, self.dur,
                  self.cpu_gap, self.gpu_gap, self.site, self.step, self.tag, self.p2p, self.peer, self.sync)
        for k, v in changes.items():
            setattr(new, k, v)
        new.sig = None
        return new


_PROGRAMS: dict[tuple[str, int], list[_Op]] = {}


def _program(job: _Job, r: int) -> list[_Op]:
    """What rank r issues, in order (a fresh list; the ops are shared and must be copied, never
    changed in place)."""
    key = (job.layout, r)
    if key not in _PROGRAMS:
        _PROGRAMS[key] = _build_program(job, r)
    return list(_PROGRAMS[key])


def _build_program(job: _Job, r: int) -> list[_Op]:
    """Megatron-like GPipe steps with sequence-parallel TP."""
    st = job.stage(r)
    tp, h = job.tp, job.hidden
    shard, full = [SEQ // tp, 1, h], [SEQ, 1, h]
    bf, fp = ["BFloat16"], ["Float"]
    tpg, dpg = job.tp_of[r], job.dp_of[r]
    scale = h / 4096
    ag_dur, rs_dur = int(0.45 * MS * scale), int(0.55 * MS * scale)
    ops: list[_Op] = []

    def tp_op(kind, step, tag, gpu_gap):
        if kind == "ag":
            return _Op(tpg, "_all_gather_base", [shard], bf, [full], bf, ag_dur, 120_000, gpu_gap, "tp_ag", step, tag)
        return _Op(tpg, "_reduce_scatter_base", [full], bf, [shard], bf, rs_dur, 120_000, gpu_gap, "tp_rs", step, tag)

    def p2p(kind, step, tag, group, peer):
        site = ("pp_send" if kind == "send" else "pp_recv") + ("_grad" if "grad" in tag else "")
        return _Op(group, kind, [shard], bf, [shard], bf, 350_000, 80_000, 50_000, site, step, tag, p2p=kind, peer=peer)

    per_stage = tp * job.dp
    for step in range(STEPS):
        ops.append(_Op(tpg, "broadcast", [[1, SEQ]], ["Long"], [[1, SEQ]], ["Long"], 40_000, 30 * MS, 20_000,
                       "tp_bcast", step, "bcast"))
        for mb in range(MICROBATCHES):
            if st > 0:
                ops.append(p2p("recv", step, f"recv_act{mb}", job.pp_prev[r], r - per_stage))
            for layer in range(LAYERS):
                for i, kind in enumerate(("ag", "rs", "ag", "rs")):
                    ops.append(tp_op(kind, step, f"f{mb}.{layer}.{kind}{i // 2 + 1}", 900_000 if kind == "ag" else 1_800_000))
            if st < job.pp - 1:
                ops.append(p2p("send", step, f"send_act{mb}", job.pp_next[r], r + per_stage))
        for mb in range(MICROBATCHES):
            if st < job.pp - 1:
                ops.append(p2p("recv", step, f"recv_grad{mb}", job.pp_next[r], r + per_stage))
            for layer in reversed(range(LAYERS)):
                for i, kind in enumerate(("ag", "rs", "ag", "rs")):
                    ops.append(tp_op(kind, step, f"b{mb}.{layer}.{kind}{i // 2 + 1}", 1_600_000 if kind == "ag" else 2_600_000))
            if st > 0:
                ops.append(p2p("send", step, f"send_grad{mb}", job.pp_prev[r], r - per_stage))
        for k in range(BUCKETS):
            ops.append(_Op(dpg, "all_reduce", [[BUCKET_NUMEL]], fp, [[BUCKET_NUMEL]], fp, 6 * MS, 60_000, 1_000_000,
                           "dp_bucket", step, f"bucket{k}"))
        if job.pp > 1 and st == job.pp - 1:
            ops.append(_Op(dpg, "all_reduce", [[1]], fp, [[1]], fp, 30_000, 60_000, 100_000, "dp_loss", step, "loss"))
        if step in BARRIER_STEPS:
            ops.append(_Op("0", "all_reduce_barrier", [[1]], fp, [[1]], fp, 40_000, 50_000, 50_000, "barrier", step, "barrier"))
        ops[-1].sync = True   # the CPU waits for the step's GPU work (loss.item(), optimizer)
    return ops


def _find(prog: list[_Op], step: int, tag: str) -> int:
    for i, op in enumerate(prog):
        if op.step == step and op.tag == tag:
            return i
    raise KeyError((step, tag))


def _seq_at(prog: list[_Op], index: int) -> int:
    """collective_seq_id (or p2p_seq_id for p2p) that the op at ``index`` gets on this rank."""
    target = prog[index]
    n = 0
    for op in prog[: index + 1]:
        if op.group == target.group and (op.p2p is None) == (target.p2p is None):
            n += 1
    return n


# --------------------------------------------------------------------------------------------
# Discrete-event model
# --------------------------------------------------------------------------------------------

def _numel(sizes) -> int:
    n = 1
    for d in sizes:
        n *= d
    return n


def _signature(op: _Op):
    """What NCCL needs to agree on: collective type and byte count (p2p: bytes only)."""
    if op.sig is None:
        op.sig = _compute_signature(op)
    return op.sig


def _compute_signature(op: _Op):
    if op.p2p is not None:
        return ("p2p", _numel(op.in_sizes[0]) * DTYPE_BYTES[op.in_dtypes[0]])
    if op.op == "_reduce_scatter_base":
        return (op.op, _numel(op.out_sizes[0]) * DTYPE_BYTES[op.out_dtypes[0]])
    return (op.op, _numel(op.in_sizes[0]) * DTYPE_BYTES[op.in_dtypes[0]])


class _Sim:
    """Per rank: CPU issue, GPU start and end times of every op (None: never).

    NCCL (``blocking=False``): the CPU issues ops back to back and waits only after an op marked
    ``sync`` (end of step) until that op's GPU work is done; the GPU runs the rank's ops in order,
    each after its compute gap. gloo (``blocking=True``): every op blocks the CPU. A collective
    instance (k-th op of a rank in a group; p2p: k-th op of a (src, dst) channel) completes when all
    members have started it and their ops agree on type and byte count; otherwise it hangs.
    ``stuck[r] = i``: rank r's op i completes for its peers but never on r (its GPU is stuck).
    ``held[r] = i``: rank r's GPU never starts op i (a kernel before it never finishes)."""

    def __init__(self, job: _Job, progs: dict[int, list[_Op]], *, blocking: bool, seed: str,
                 stuck: dict[int, int] | None = None, straggler: dict[int, int] | None = None, noise_ns: int = 0,
                 held: dict[int, int] | None = None):
        self.job, self.progs = job, progs
        world = job.world
        stuck = stuck or {}
        held = held or {}
        straggler = straggler or {}
        rng = random.Random(seed + ":sim")
        rand = rng.random
        self.t0 = {r: T0 + rng.randint(0, 3 * MS) for r in range(world)}
        self.wd_phase = {r: rng.randint(0, WATCHDOG_NS - 1) for r in range(world)}
        dur_scale = 3 if blocking else 1
        cpu_gap, gpu_gap, keys, sigs, durs = {}, {}, {}, {}, {}
        sizes = {g: len(ranks) for g, (_, ranks) in job.groups.items()}
        for r in range(world):
            cg, gg, ks, sg, du = [], [], [], [], []
            counts: dict = {}
            extra = straggler.get(r, 0)
            for op in progs[r]:
                c = op.cpu_gap + (op.gpu_gap if blocking else 0)
                c = max(5_000, int(c + (rand() - 0.5) * 60_000)) + extra
                if noise_ns:
                    c += int(rand() * noise_ns)
                cg.append(c)
                gg.append(0 if blocking else max(1_000, int(op.gpu_gap * (0.97 + 0.06 * rand()))))
                if op.p2p is None:
                    ck = ("c", op.group)
                    members = sizes[op.group]
                else:
                    ck = ("p", op.group, r, op.peer) if op.p2p == "send" else ("p", op.group, op.peer, r)
                    members = 2
                n = counts.get(ck, 0) + 1
                counts[ck] = n
                ks.append((ck + (n,), members))
                sg.append(_signature(op))
                du.append(op.dur * dur_scale)
            cpu_gap[r], gpu_gap[r], keys[r], sigs[r], durs[r] = cg, gg, ks, sg, du
        self.keys = keys
        issue = {r: [None] * len(progs[r]) for r in range(world)}
        start = {r: [None] * len(progs[r]) for r in range(world)}
        end = {r: [None] * len(progs[r]) for r in range(world)}
        inst: dict = {}        # key -> [members needed, {rank: index}, end or None, poisoned]
        n_issued = {r: 0 for r in range(world)}
        n_started = {r: 0 for r in range(world)}
        work = list(range(world))
        queued = set(work)
        while work:
            r = work.pop()
            queued.discard(r)
            prog, iss, sta, en = progs[r], issue[r], start[r], end[r]
            cg, gg, ks = cpu_gap[r], gpu_gap[r], keys[r]
            n = len(prog)
            moved = True
            while moved:
                moved = False
                i = n_issued[r]
                while i < n:
                    if i == 0:
                        base = self.t0[r]
                    elif blocking or prog[i - 1].sync:
                        base = en[i - 1]
                        if base is None:
                            break
                    else:
                        base = iss[i - 1]
                    iss[i] = base + cg[i]
                    i += 1
                    moved = True
                n_issued[r] = i
                j = n_started[r]
                while j < i and held.get(r) != j:
                    if j > 0:
                        prev = en[j - 1]
                        if prev is None:
                            break
                        t = prev + gg[j]
                        s = iss[j] if iss[j] > t else t
                    else:
                        s = iss[j]
                    sta[j] = s
                    j += 1
                    n_started[r] = j
                    moved = True
                    key, members = ks[j - 1]
                    rec = inst.get(key)
                    if rec is None:
                        rec = inst[key] = [members, {}, None, False]
                    got = rec[1]
                    got[r] = j - 1
                    if len(got) == members:
                        if len({sigs[m][idx] for m, idx in got.items()}) != 1:
                            rec[3] = True
                            continue
                        t_end = max(start[m][idx] for m, idx in got.items()) + durs[r][j - 1]
                        rec[2] = t_end
                        for m, idx in got.items():
                            if stuck.get(m) == idx:
                                continue
                            end[m][idx] = t_end
                            if m != r and m not in queued:
                                work.append(m)
                                queued.add(m)
        self.issue, self.start, self.end, self.inst = issue, start, end, inst
        self.n_issued = n_issued

    def finished(self) -> bool:
        return all(self.end[r][-1] is not None for r in self.progs if self.progs[r])


# --------------------------------------------------------------------------------------------
# Dump emission
# --------------------------------------------------------------------------------------------

def _tick_after(t: int, phase: int) -> int:
    k = (t - phase + WATCHDOG_NS - 1) // WATCHDOG_NS
    return phase + k * WATCHDOG_NS


def _gloo_shape(job: _Job, op: _Op):
    """How the gloo backend records the op: (name, in_sizes, in_dtypes, out_sizes, out_dtypes)."""
    if op.op == "_all_gather_base":       # all_gather_into_tensor -> gloo:all_gather, output [W, *input]
        n = len(job.groups[op.group][1])
        return "all_gather", op.in_sizes, op.in_dtypes, [[n] + list(op.in_sizes[0])], op.out_dtypes
    if op.op == "_reduce_scatter_base":   # reduce_scatter_tensor -> gloo:all_reduce of the whole input
        return "all_reduce", op.in_sizes, op.in_dtypes, op.in_sizes, op.in_dtypes
    if op.op == "all_reduce_barrier":
        return "barrier", [], [], [], []
    return op.op, op.in_sizes, op.in_dtypes, op.out_sizes, op.out_dtypes


def _dump_for_rank(job: _Job, sim: _Sim, r: int, fmt: str, buffer: int, t_dump: float) -> dict:
    prog = sim.progs[r]
    gloo = fmt == "gloo"
    pg_id = {g: i for i, g in enumerate(job.member_groups[r])}
    coll = {g: 0 for g in pg_id}
    p2ps = {g: 0 for g in pg_id}
    opid = {g: 0 for g in pg_id}
    status = {g: [-1, -1, -1] for g in pg_id}   # enqueued, started, completed (collective seq ids)
    phase = sim.wd_phase[r]
    thread_id = str(139_800_000_000_000 + 4096 * r)
    entries = []
    record = 0
    recorded = sum(1 for i, op in enumerate(prog) if sim.issue[r][i] is not None and sim.issue[r][i] <= t_dump
                   and not (gloo and op.p2p is not None))
    first_kept = recorded - buffer      # older records fell out of the ring buffer: counted, not built
    for i, op in enumerate(prog):
        t_issue = sim.issue[r][i]
        if t_issue is None or t_issue > t_dump:
            break
        g = op.group
        opid[g] += 1
        if op.p2p is None:
            coll[g] += 1
        else:
            p2ps[g] += 1
        s, e = sim.start[r][i], sim.end[r][i]
        started = s is not None and s <= t_dump
        completed = e is not None and e <= t_dump
        if op.p2p is None:
            status[g][0] = coll[g]
            if started:
                status[g][1] = coll[g]
            if completed:
                status[g][2] = coll[g]
        if gloo and op.p2p is not None:
            continue   # gloo does not record send/recv
        if record < first_kept:
            record += 1
            continue
        if gloo:
            name, ins, indt, outs, outdt = _gloo_shape(job, op)
            prof = f"gloo:{name}"
            state, ds, dc = "scheduled", None, None
            retired = completed
        else:
            ins, indt, outs, outdt = op.in_sizes, op.in_dtypes, op.out_sizes, op.out_dtypes
            if op.p2p is not None:
                local = sorted(job.groups[g][1])
                arrow = "->" if op.p2p == "send" else "<-"
                prof = f"nccl:{op.p2p} {local.index(r)}{arrow}{local.index(op.peer)}"
            else:
                prof = f"nccl:{op.op}"
            ds = dc = None
            retired = False
            if completed:
                state = "completed"
                ds = min(_tick_after(s, phase), t_dump)
                dc = min(_tick_after(e, phase), t_dump)
                retired = _tick_after(e, phase) <= t_dump
            elif started:
                state = "started"
                ds = min(_tick_after(s, phase), t_dump)
            else:
                state = "scheduled"
        entry = {}
        if fmt != "json":
            entry["frames"] = _frames(op.site)
        entry.update({
            "record_id": record,
            "pg_id": pg_id[g],
            "process_group": (g, job.desc(g)),
            "thread_name": "python" if gloo else "pt_main_thread",
            "thread_id": thread_id,
            "collective_seq_id": coll[g],
            "p2p_seq_id": p2ps[g],
            "op_id": opid[g],
            "profiling_name": prof,
            "time_created_ns": t_issue,
        })
        if not gloo and completed and retired:
            entry["duration_ms"] = round((e - s) / 1e6, 6)
        entry.update({
            "input_sizes": [list(x) for x in ins],
            "input_dtypes": list(indt),
            "output_sizes": [list(x) for x in outs],
            "output_dtypes": list(outdt),
            "state": state,
            "time_discovered_started_ns": ds,
            "time_discovered_completed_ns": dc,
            "retired": retired,
            "timeout_ms": 1_800_000 if gloo else 600_000,
            "is_p2p": op.p2p is not None,
        })
        entries.append(entry)
        record += 1
    assert len(entries) <= buffer
    if gloo:
        if r % 3 == 0:
            pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(job.world)))}}
        else:
            pg_config = {"": {"name": "", "desc": "", "ranks": "[]"}}
    else:
        names = list(job.groups) if job.all_groups_in_config else job.member_groups[r]
        pg_config = {g: {"name": g, "desc": job.desc(g), "ranks": json.dumps(list(job.groups[g][1]))} for g in names}
    pg_status = {str(pg_id[g]): {"last_enqueued_collective": v[0], "last_started_collective": -1 if gloo else v[1],
                                 "last_completed_collective": v[2]} for g, v in status.items()}
    return {"version": "2.10", "pg_config": pg_config, "comm_lib_version": "" if gloo else "2.21.5",
            "pg_status": pg_status, "entries": entries}


def _to_json_text(dump: dict) -> str:
    doc = {
        "comm_lib_version": dump["comm_lib_version"],
        "entries": [],
        "nccl_comm_state": {},
        "pg_config": dump["pg_config"],
        "pg_status": {k: {kk: str(vv) for kk, vv in v.items()} for k, v in dump["pg_status"].items()},
        "version": dump["version"],
    }
    for e in dump["entries"]:
        e = dict(e)
        e.pop("frames", None)
        e["process_group"] = list(e["process_group"])
        for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            if e[k] is None:
                e[k] = 0
        doc["entries"].append(e)
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


# --------------------------------------------------------------------------------------------
# Scenario specifications
# --------------------------------------------------------------------------------------------

@dataclass
class _Spec:
    layout: str
    fault: str
    position: str
    fmt: str
    culprit_dump: str
    tag: str = ""
    culprit: int | None = None
    buffer: int = 2000
    dump: str = "end"                 # "end" (T = infinity) | "midflight"
    remove: list = field(default_factory=list)      # (rank, step, tag)
    insert: list = field(default_factory=list)      # (rank, step, after_tag, _Op)
    modify: list = field(default_factory=list)      # (rank, step, tag, changes)
    move: list = field(default_factory=list)        # (rank, step, tag, before_tag)
    crash: tuple | None = None                       # (rank, step, tag): rank dies before issuing this op
    stuck: tuple | None = None                       # (rank, step, tag): rank's GPU never finishes this op
    held: tuple | None = None                        # (rank, step, tag): rank's GPU never starts this op
    straggler: int | None = None
    noise_ns: int = 0
    expected: Expected | None = None
    absent_reason: str = ""

    @property
    def name(self) -> str:
        base = f"{self.layout}__{self.fault}__{self.position}__{self.fmt}__{self.culprit_dump}"
        return base + (f"__{self.tag}" if self.tag else "")


def _apply(job: _Job, spec: _Spec) -> tuple[dict[int, list[_Op]], dict[int, int], dict[int, int]]:
    progs = {r: _program(job, r) for r in range(job.world)}
    for r, step, tag, changes in spec.modify:
        i = _find(progs[r], step, tag)
        progs[r][i] = progs[r][i].copy(**changes)
    for r, step, after, op in spec.insert:
        i = _find(progs[r], step, after)
        progs[r].insert(i + 1, op.copy(step=step, sync=False))
    for r, step, tag, before in spec.move:
        i = _find(progs[r], step, tag)
        op = progs[r].pop(i).copy(sync=False)
        progs[r].insert(_find(progs[r], step, before), op)
    for r, step, tag in spec.remove:
        i = _find(progs[r], step, tag)
        was_sync = progs[r][i].sync
        del progs[r][i]
        if was_sync:
            progs[r][i - 1] = progs[r][i - 1].copy(sync=True)
    stuck, held = {}, {}
    if spec.stuck:
        r, step, tag = spec.stuck
        stuck[r] = _find(progs[r], step, tag)
    if spec.held:
        r, step, tag = spec.held
        held[r] = _find(progs[r], step, tag)
    if spec.crash:
        r, step, tag = spec.crash
        progs[r] = progs[r][: _find(progs[r], step, tag)]
    return progs, stuck, held


def _simulate(spec: _Spec):
    job = _Job(spec.layout)
    progs, stuck, held = _apply(job, spec)
    straggler = {spec.culprit: 20 * MS} if spec.straggler else {}
    sim = _Sim(job, progs, blocking=spec.fmt == "gloo", seed=spec.name, stuck=stuck, straggler=straggler,
               noise_ns=spec.noise_ns, held=held)
    return job, sim


def _midflight_time(job: _Job, sim: _Sim, step: int) -> int:
    """A moment inside the default-group barrier that ends ``step``: every rank has started it, none finished."""
    starts = []
    for r in range(job.world):
        i = _find(sim.progs[r], step, "barrier")
        starts.append(sim.start[r][i])
    latest = max(starts)
    return latest + 10_000


def _waiting_on(job: _Job, sim: _Sim, absent: int):
    """Where the other ranks wait for ``absent``: among the unfinished instances that hold it and
    that every other member has started (so they wait on it alone), the one ``absent`` would have
    reached first in its own unmodified program (ties: the one its peers started waiting on
    first). Returns (group, seq on the present members) or (None, None)."""
    original = _program(job, absent)
    order = {}
    counts: dict = {}
    for i, op in enumerate(original):
        if op.p2p is None:
            ck = ("c", op.group)
        else:
            ck = ("p", op.group) + ((absent, op.peer) if op.p2p == "send" else (op.peer, absent))
        counts[ck] = counts.get(ck, 0) + 1
        order[ck + (counts[ck],)] = i
    best = None
    for key, (members, got, t_end, poisoned) in sim.inst.items():
        if t_end is not None and not poisoned:
            continue
        group = key[1]
        ranks = job.groups[group][1] if key[0] == "c" else (key[2], key[3])
        if absent not in ranks:
            continue
        present = [m for m in ranks if m != absent]
        if not present or any(m not in got for m in present):
            continue
        rank_key = (order.get(key, len(original)), max(sim.start[m][got[m]] for m in present))
        if best is None or rank_key < best[0]:
            m = present[0]
            best = (rank_key, group, _seq_at(sim.progs[m], got[m]))
    if best is None:
        return None, None
    return best[1], best[2]


# ---- fault builders ------------------------------------------------------------------------

def _pick(rng: random.Random, ranks, tag: str):
    ranks = sorted(ranks)
    if tag == "r0":
        assert ranks[0] == 0, ranks
        return 0
    if tag == "rmax":
        return ranks[-1]
    return rng.choice(ranks)


def _rng(spec: _Spec) -> random.Random:
    return random.Random(spec.name)


def _last_tp_bwd(job: _Job) -> str:
    return f"b{MICROBATCHES - 1}.0.rs2"


def _absent_expected(spec: _Spec, why: str) -> Expected:
    job, sim = _simulate(spec)
    group, seq = _waiting_on(job, sim, spec.culprit)
    return Expected("missing_dump", (spec.culprit,), job.desc(group) if group else None, seq,
                    f"rank {spec.culprit} has no dump and its peers wait for it in {job.desc(group) if group else '?'} "
                    f"#{seq}; {why}")


def _last_op_of_step(job: _Job, spec: _Spec, rng, all_ranks) -> tuple[int, int, str, str]:
    """The culprit and the last op of a step it fails in (a dp bucket, a pipeline's loss, or the
    default barrier when the tag says so): (culprit, step, tag, group description)."""
    gk = spec.tag.split("-")[0] if spec.tag.startswith(("dp", "default")) else "dp"
    spec.culprit = c = _pick(rng, all_ranks, spec.tag.split("-")[-1])
    if gk == "default":
        return c, 11, "barrier", "default_pg"
    return c, 10, ("loss" if job.pp > 1 and job.stage(c) == job.pp - 1 else f"bucket{BUCKETS - 1}"), "dp"


def _build(spec: _Spec) -> _Spec:
    """Fill in culprit, mutations and expected for one spec."""
    job = _Job(spec.layout)
    rng = _rng(spec)
    f, pos = spec.fault, spec.position
    world = job.world
    all_ranks = range(world)
    spec.buffer = rng.choice([2000, 400]) if pos == "older" else rng.choice([2000, 2000, 260, 200])
    group_of = {"tp": job.tp_of, "dp": job.dp_of}

    if f.startswith("healthy"):
        if f == "healthy_midflight":
            spec.dump = "midflight"
        if f == "healthy_wrapped":
            spec.buffer = 150
        if f == "healthy_noise":
            spec.noise_ns = 4 * MS
        what = {"healthy": "every collective matched and completed",
                "healthy_midflight": "snapshot inside the final barrier of step 11: every rank started the same barrier #N, none finished yet",
                "healthy_wrapped": "ring buffers of 150 entries wrapped at different points (ranks issue different numbers of ops)",
                "healthy_noise": "every rank jittered by 0-4 ms per op; nobody is consistently late"}[f]
        spec.expected = Expected(None, (), None, None, what)
        return spec

    if f == "straggler":
        spec.culprit = _pick(rng, all_ranks, spec.tag)
        spec.straggler = 20 * MS
        spec.expected = Expected("straggler", (spec.culprit,), None, None,
                                 f"rank {spec.culprit} spends 20 ms more per op (others: ~0.03 ms noise), so it creates every "
                                 "collective late and its peers wait for it (those lag less); every collective completes")
        return spec

    if f in ("skipped_collective", "cross_group_hang") and pos == "inflight":
        gk = spec.tag.split("-")[0] if spec.tag.startswith(("tp", "dp")) else ("tp" if f == "cross_group_hang" else "dp")
        wenton = "wenton" in spec.tag
        step = 10 if wenton else 11
        spec.culprit = _pick(rng, all_ranks, spec.tag.split("-")[-1])
        if gk == "dp" and job.pp > 1 and job.stage(spec.culprit) == job.pp - 1:
            spec.culprit -= job.tp * job.dp
        c = spec.culprit
        tag = _last_tp_bwd(job) if gk == "tp" else f"bucket{BUCKETS - 1}"
        spec.remove.append((c, step, tag))
        prog = _program(job, c)
        seq = _seq_at(prog, _find(prog, step, tag))
        g = group_of[gk][c]
        if wenton:
            note = (f"rank {c} skipped {gk} #{seq} (last {gk} op of step {step}) and went on: its #{seq} is the next "
                    f"step's broadcast, created after its step-{step} dp all-reduces completed; peers wait in the skipped op")
        elif f == "cross_group_hang":
            note = (f"root: rank {c} never issued {gk} #{seq}; its {gk} peers wait there, the ranks sharing their other "
                    f"groups wait for them there; rank {c} itself waits in the default-group barrier")
        else:
            note = (f"rank {c} never issued {gk} #{seq} (last {gk} op before the step-{step} barrier) and waits in the "
                    f"barrier; its {gk} peers wait in #{seq}")
        if spec.culprit_dump == "absent":
            if f == "cross_group_hang":
                spec.expected = Expected("skipped_collective", (c,), gk, seq,
                                         f"rank {c} has no dump, but its dp peers completed step-{step} dp all-reduces with it "
                                         f"after its {gk} peers got stuck waiting for it in {gk} #{seq}: it went past #{seq} "
                                         "without issuing it")
            else:
                spec.expected = _absent_expected(spec, "it may have crashed before the op; nothing in the other dumps shows "
                                                       "it went past the op, so the skip cannot be told from a crash")
        else:
            spec.expected = Expected("skipped_collective", (c,), gk, seq, note)
        return spec

    if f in ("skipped_collective", "extra_collective") and pos == "older":
        spec.culprit = _pick(rng, all_ranks, spec.tag)
        c = spec.culprit
        step = 8
        prog = _program(job, c)
        if f == "skipped_collective":
            spec.remove.append((c, step, "bucket0"))
            seq = _seq_at(prog, _find(prog, step, "bucket0"))
            note = (f"rank {c} skipped dp #{seq} (bucket0 of step {step}); equal-size buckets kept matching one-off, so "
                    f"the job went on until the step-11 barrier where its dp peers wait in one more all-reduce than it issued")
        else:
            i = _find(prog, step, "bucket0")
            spec.insert.append((c, step, "bucket0", prog[i].copy(tag="bucket0-again")))
            seq = _seq_at(prog, i) + 1
            note = (f"rank {c} issued an extra dp all-reduce #{seq} (bucket0 twice in step {step}); equal sizes kept it "
                    f"matching one-off until the step-11 barrier, where it waits in a dp all-reduce its peers never issue")
        if spec.culprit_dump == "absent":
            spec.expected = _absent_expected(spec, "with its dump gone the shifted history is invisible (buckets are equal) "
                                                   "and the hang looks like a crash")
        else:
            spec.expected = Expected(f, (c,), "dp", seq, note)
        return spec

    if f == "extra_collective":   # inflight
        wenton = "wenton" in spec.tag
        gk = "dp" if wenton else "tp"
        spec.culprit = _pick(rng, all_ranks, spec.tag.split("-")[-1])
        c = spec.culprit
        step = 10 if wenton else 11
        prog = _program(job, c)
        after = "bucket0" if wenton else _last_tp_bwd(job)
        i = _find(prog, step, after)
        g = group_of[gk][c]
        extra = _Op(g, "all_reduce", [[1]], ["Float"], [[1]], ["Float"], 30_000, 60_000, 100_000, "tp_debug", step,
                    "extra")
        spec.insert.append((c, step, after, extra))
        seq = _seq_at(prog, i) + 1
        if wenton:
            note = (f"rank {c} issued an extra dp all_reduce [1] as #{seq}; its peers' #{seq} is bucket1, which rank {c} "
                    f"issued as #{seq + 1} (NCCL: enqueued behind it)")
        else:
            note = (f"rank {c} issued an extra tp all_reduce [1] as #{seq} after the step-{step} backward; its tp peers "
                    f"never issue #{seq} (they wait in the barrier), its dp peers wait for its bucket all-reduce")
        if spec.culprit_dump == "absent":
            spec.expected = _absent_expected(spec, "the extra op is only in its own dump; the others just see it missing")
        else:
            spec.expected = Expected("extra_collective", (c,), gk, seq, note)
        return spec

    if f in ("type_mismatch", "size_mismatch", "dtype_mismatch"):
        gk = spec.tag.split("-")[0] if spec.tag.startswith(("tp", "dp")) else "tp"
        spec.culprit = _pick(rng, all_ranks, spec.tag.split("-")[-1])
        c = spec.culprit
        step = rng.choice([9, 10, 11]) if pos == "inflight" else rng.choice([5, 6, 8])
        tp, h = job.tp, job.hidden
        if gk == "tp":
            tag = rng.choice(["f0.0.ag1", "f1.0.ag2", "b0.0.ag1"])
            if f == "type_mismatch":
                changes = dict(op="all_reduce", in_sizes=[[SEQ, 1, h]], out_sizes=[[SEQ, 1, h]], site="tp_ar_nosp")
                what = "issues an all_reduce of the full activation (sequence parallel off) where its peers all-gather"
            elif f == "size_mismatch" and pos == "inflight":
                changes = dict(in_sizes=[[SEQ // 2 // tp, 1, h]], out_sizes=[[SEQ // 2, 1, h]])
                what = f"all-gathers a half-length sequence ([{SEQ // 2 // tp}, 1, {h}] -> [{SEQ // 2}, 1, {h}])"
            elif f == "size_mismatch":
                changes = dict(in_sizes=[[1, SEQ // tp, h]], out_sizes=[[tp, SEQ // tp, h]])
                what = "all-gathers a batch-first tensor (same element count, different shape); NCCL only sees the count"
            elif pos == "inflight":
                changes = dict(in_dtypes=["Float"], out_dtypes=["Float"])
                what = "all-gathers Float where its peers use BFloat16 (autocast off on that rank)"
            else:
                changes = dict(in_dtypes=["Half"], out_dtypes=["Half"])
                what = "all-gathers Half where its peers use BFloat16 (same byte count, so NCCL completes it)"
        else:
            tag = rng.choice(["bucket0", "bucket1"])
            if job.pp > 1 and job.stage(c) == job.pp - 1 and tag == "bucket1":
                tag = "bucket0"
            if f == "type_mismatch" and spec.fmt == "gloo":
                # gloo records reduce_scatter_tensor as an all_reduce of the whole input (and it
                # would match), so on gloo the wrong op is a broadcast of the bucket
                changes = dict(op="broadcast", site="dp_bcast")
                what = "broadcasts the gradient bucket (a parameter-sync code path) where its peers all-reduce it"
            elif f == "type_mismatch":
                changes = dict(op="_reduce_scatter_base", out_sizes=[[BUCKET_NUMEL // job.dp]], site="dp_zero_rs")
                what = "reduce-scatters the gradient bucket (ZeRO on) where its peers all-reduce it"
            elif f == "size_mismatch":
                changes = dict(in_sizes=[[BUCKET_NUMEL // 2]], out_sizes=[[BUCKET_NUMEL // 2]])
                what = "all-reduces a half-size bucket"
            else:
                changes = dict(in_dtypes=["BFloat16"], out_dtypes=["BFloat16"])
                what = "all-reduces the bucket in BFloat16 where its peers use Float"
        spec.modify.append((c, step, tag, changes))
        prog = _program(job, c)
        seq = _seq_at(prog, _find(prog, step, tag))
        if pos == "inflight":
            note = f"at {gk} #{seq} (step {step}) rank {c} {what}; the collective hangs there"
        else:
            note = f"at {gk} #{seq} (step {step}) rank {c} {what}; the job went on and finished"
        if spec.culprit_dump == "absent":
            spec.expected = _absent_expected(spec, "the mismatching op is only in its own dump")
        else:
            spec.expected = Expected(f, (c,), gk, seq, note)
        return spec

    if f == "stuck_in_collective":
        c, step, tag, desc = _last_op_of_step(job, spec, rng, all_ranks)
        spec.stuck = (c, step, tag)
        prog = _program(job, c)
        seq = _seq_at(prog, _find(prog, step, tag))
        if spec.culprit_dump == "absent":
            spec.expected = _absent_expected(spec, "its peers completed the op and wait in the next step, as after a crash")
        else:
            spec.expected = Expected("stuck_in_collective", (c,), desc, seq,
                                     f"rank {c}'s {desc} #{seq} (last op of step {step}) stays 'started' while every peer "
                                     f"completed it; its CPU waits for it, so it never issues step {step + 1}")
        return spec

    if f == "not_started":
        c, step, tag, desc = _last_op_of_step(job, spec, rng, all_ranks)
        spec.held = (c, step, tag)
        prog = _program(job, c)
        seq = _seq_at(prog, _find(prog, step, tag))
        spec.expected = Expected("not_started", (c,), desc, seq,
                                 f"rank {c}'s GPU never starts {desc} #{seq} (last op of step {step}): everything "
                                 f"before it completed, its peers started it and wait inside")
        return spec

    if f == "state_mismatch":
        spec.culprit = _pick(rng, all_ranks, spec.tag)
        c = spec.culprit
        step, tag = 10, "f0.0.ag1"
        spec.stuck = (c, step, tag)
        prog = _program(job, c)
        seq = _seq_at(prog, _find(prog, step, tag))
        if spec.culprit_dump == "absent":
            spec.expected = _absent_expected(spec, "its peers completed the op and wait in the next one, as after a crash")
        else:
            spec.expected = Expected("state_mismatch", (c,), "tp", seq,
                                     f"tp #{seq}: its peers 'completed' it, rank {c} still 'started' although it enqueued "
                                     f"#{seq + 1} and the rest of step {step} (its GPU never finished #{seq})")
        return spec

    if f == "missing_dump":
        gk = spec.tag.split("-")[0] if spec.tag.startswith(("tp", "dp")) else "tp"
        spec.culprit = _pick(rng, all_ranks, spec.tag.split("-")[-1])
        c = spec.culprit
        step = rng.choice([10, 11])
        tag = rng.choice(["f1.0.rs1", "b0.0.ag2"]) if gk == "tp" else "bucket0"
        spec.crash = (c, step, tag)
        prog = _program(job, c)
        seq = _seq_at(prog, _find(prog, step, tag))
        spec.expected = Expected("missing_dump", (c,), gk, seq,
                                 f"rank {c} died before {gk} #{seq} of step {step} (no dump); its {gk} peers wait there "
                                 "first, its other peers later")
        return spec

    if f == "p2p_unmatched":
        side = "recv" if "recv" in spec.tag else "send"
        per_stage = job.tp * job.dp
        if side == "recv":
            cands = [r for r in all_ranks if job.stage(r) >= 1]
        else:
            cands = [r for r in all_ranks if job.stage(r) <= job.pp - 2]
        if "mid" in spec.tag:
            cands = [r for r in cands if 0 < job.stage(r) < job.pp - 1]
        spec.culprit = _pick(rng, cands, spec.tag.split("-")[-1])
        c = spec.culprit
        step = 10
        mb = MICROBATCHES - 1
        if side == "recv":
            spec.remove.append((c, step, f"recv_act{mb}"))
            waiter = c - per_stage
            wprog = _program(job, waiter)
            seq = _seq_at(wprog, _find(wprog, step, f"send_act{mb}"))
            note = (f"rank {waiter} posted send p2p #{seq} to rank {c} (activation of microbatch {mb}, step {step}); rank "
                    f"{c} never posted the recv and went on")
        else:
            spec.remove.append((c, step, f"send_act{mb}"))
            waiter = c + per_stage
            wprog = _program(job, waiter)
            seq = _seq_at(wprog, _find(wprog, step, f"recv_act{mb}"))
            note = (f"rank {waiter} posted recv p2p #{seq} from rank {c} (activation of microbatch {mb}, step {step}); "
                    f"rank {c} never posted the send and went on to its backward recv")
        if spec.culprit_dump == "absent":
            spec.expected = _absent_expected(spec, "the missing send is visible only in its own dump; its tp peers' "
                                                   "completed ops all precede the send, as if it crashed there")
        else:
            spec.expected = Expected("p2p_unmatched", (c,), "pp", seq, note)
        return spec

    if f == "deadlock":
        st = 0
        t_a, t_b = rng.sample(range(job.tp), 2)
        d_a, d_b = rng.sample(range(job.dp), 2)
        s1, s2 = job.rank(st, d_a, t_a), job.rank(st, d_b, t_b)
        n1, n2 = job.rank(st, d_a, t_b), job.rank(st, d_b, t_a)
        step = 10
        for s in (s1, s2):
            spec.move.append((s, step, "bucket0", _last_tp_bwd(job)))
        spec.culprit = s1
        cyc = tuple(sorted({s1, s2, n1, n2}))
        spec.expected = Expected("deadlock", cyc, None, None,
                                 f"ranks {s1} and {s2} start their dp bucket all-reduce before their last tp op of step "
                                 f"{step}: {s1} waits in dp for {n2}, {n2} in tp for {s2}, {s2} in dp for {n1}, {n1} in tp "
                                 f"for {s1}")
        return spec

    raise ValueError(f"no builder for {spec.fault}/{spec.position}")


def _matrix() -> list[_Spec]:
    A, B, C, D, E, F = LAYOUTS
    P, J, G = "pickle", "json", "gloo"
    rows = []

    def add(layout, fault, position, fmt, dump="present", tag=""):
        rows.append(_Spec(layout, fault, position, fmt, dump, tag=tag))

    # healthy: every layout in every format, plus mid-flight, wrapped and jittered variants
    for layout, variants in {
        A: [("healthy", P), ("healthy", J), ("healthy", G), ("healthy_noise", P)],
        B: [("healthy", P), ("healthy_midflight", J), ("healthy", G)],
        C: [("healthy_midflight", P), ("healthy", J), ("healthy_midflight", G), ("healthy_noise", G)],
        D: [("healthy_wrapped", P), ("healthy", J), ("healthy_wrapped", G)],
        E: [("healthy", P), ("healthy_midflight", J), ("healthy", G), ("healthy_noise", J)],
        F: [("healthy_wrapped", P), ("healthy", J), ("healthy_midflight", G), ("healthy_noise", P)],
    }.items():
        for fault, fmt in variants:
            add(layout, fault, "-", fmt)
    # skipped_collective
    add(A, "skipped_collective", "inflight", P, tag="tp")
    add(A, "skipped_collective", "inflight", G, tag="tp")
    add(A, "skipped_collective", "inflight", J, tag="tp-r0")
    add(C, "skipped_collective", "inflight", P, tag="dp")
    add(D, "skipped_collective", "inflight", P, tag="tp-wenton")
    add(E, "skipped_collective", "inflight", G, tag="tp-rmax")
    add(A, "skipped_collective", "older", P)
    add(C, "skipped_collective", "older", G)
    add(E, "skipped_collective", "older", J)
    add(C, "skipped_collective", "inflight", P, "absent", tag="dp")
    add(C, "skipped_collective", "older", P, "absent")
    # extra_collective
    add(B, "extra_collective", "inflight", P)
    add(B, "extra_collective", "inflight", G)
    add(C, "extra_collective", "inflight", J)
    add(D, "extra_collective", "inflight", P, tag="wenton")
    add(A, "extra_collective", "older", P)
    add(C, "extra_collective", "older", G)
    add(F, "extra_collective", "inflight", P, "absent")
    # type_mismatch
    add(A, "type_mismatch", "inflight", P, tag="tp")
    add(A, "type_mismatch", "inflight", G, tag="tp")
    add(C, "type_mismatch", "inflight", J, tag="dp")
    add(E, "type_mismatch", "inflight", P, tag="tp-rmax")
    add(B, "type_mismatch", "inflight", G, tag="dp")
    add(D, "type_mismatch", "inflight", P, "absent", tag="tp")
    # size_mismatch
    add(D, "size_mismatch", "inflight", P)
    add(D, "size_mismatch", "inflight", J)
    add(B, "size_mismatch", "inflight", G)
    add(E, "size_mismatch", "inflight", P)
    add(C, "size_mismatch", "inflight", P, tag="dp")
    add(A, "size_mismatch", "older", P)
    add(C, "size_mismatch", "older", G)
    add(F, "size_mismatch", "older", P, tag="r0")
    add(D, "size_mismatch", "inflight", P, "absent")
    # dtype_mismatch
    add(B, "dtype_mismatch", "inflight", P, tag="dp")
    add(B, "dtype_mismatch", "inflight", G, tag="dp")
    add(F, "dtype_mismatch", "inflight", P)
    add(D, "dtype_mismatch", "older", J)
    add(A, "dtype_mismatch", "older", P)
    add(C, "dtype_mismatch", "inflight", P, "absent")
    # not_started (NCCL only: gloo records no start)
    add(A, "not_started", "inflight", P)
    add(C, "not_started", "inflight", J)
    add(E, "not_started", "inflight", P, tag="default")
    add(F, "not_started", "inflight", P)
    # stuck_in_collective (NCCL only)
    add(A, "stuck_in_collective", "inflight", P)
    add(A, "stuck_in_collective", "inflight", J)
    add(E, "stuck_in_collective", "inflight", P, tag="default")
    add(F, "stuck_in_collective", "inflight", P)
    add(C, "stuck_in_collective", "inflight", P, "absent")
    # state_mismatch (NCCL only)
    add(A, "state_mismatch", "inflight", P)
    add(A, "state_mismatch", "inflight", J)
    add(D, "state_mismatch", "inflight", P)
    add(E, "state_mismatch", "inflight", P, tag="rmax")
    add(B, "state_mismatch", "inflight", P, "absent")
    # missing_dump (the culprit died)
    add(A, "missing_dump", "inflight", P, "absent", tag="tp")
    add(A, "missing_dump", "inflight", G, "absent", tag="tp")
    add(C, "missing_dump", "inflight", J, "absent", tag="dp")
    add(D, "missing_dump", "inflight", P, "absent", tag="tp")
    add(E, "missing_dump", "inflight", P, "absent", tag="dp-r0")
    add(F, "missing_dump", "inflight", G, "absent", tag="tp-rmax")
    # p2p_unmatched (NCCL only)
    add(B, "p2p_unmatched", "inflight", P, tag="recv")
    add(B, "p2p_unmatched", "inflight", J, tag="send")
    add(D, "p2p_unmatched", "inflight", P, tag="recv-rmax")
    add(F, "p2p_unmatched", "inflight", P, tag="send-mid")
    add(D, "p2p_unmatched", "inflight", P, "absent", tag="send")
    # deadlock
    add(A, "deadlock", "inflight", P)
    add(A, "deadlock", "inflight", G)
    add(C, "deadlock", "inflight", P)
    add(B, "deadlock", "inflight", J)
    add(E, "deadlock", "inflight", P)
    # cross-group hang: A waits in X for B, B waits in Y for C, C never issued its op in Y
    add(C, "cross_group_hang", "inflight", P, tag="tp")
    add(C, "cross_group_hang", "inflight", G, tag="tp")
    add(E, "cross_group_hang", "inflight", J, tag="tp")
    add(D, "cross_group_hang", "inflight", P, tag="dp")
    add(C, "cross_group_hang", "inflight", P, "absent", tag="tp")
    # straggler
    add(A, "straggler", "-", P)
    add(A, "straggler", "-", G)
    add(E, "straggler", "-", J)
    add(D, "straggler", "-", P)
    add(C, "straggler", "-", G)
    return rows


_CACHE: dict[str, _Spec] = {}
_ORDER: list[str] = []


def _specs() -> dict[str, _Spec]:
    if not _CACHE:
        built: dict[str, _Spec] = {}
        for spec in _matrix():
            _build(spec)
            assert spec.name not in built, spec.name
            built[spec.name] = spec
        _ORDER[:] = list(built)
        _CACHE.update(built)
    return _CACHE


def scenarios() -> list[Scenario]:
    """The whole matrix, deterministic and in a fixed order."""
    specs = _specs()
    out = []
    for name in _ORDER:
        s = specs[name]
        out.append(Scenario(name=name, world=LAYOUTS[s.layout][0], layout=s.layout, fault=s.fault, position=s.position,
                            fmt=s.fmt, culprit_dump=s.culprit_dump, expected=s.expected))
    return out


def scenario(name: str) -> Scenario:
    for s in scenarios():
        if s.name == name:
            return s
    raise KeyError(name)


def dump_documents(s: Scenario) -> dict[int, dict]:
    """Per rank (those that have a dump), the dump as a Python dict (pickle content; JSON cases are
    converted when written)."""
    spec = _specs()[s.name]
    job, sim = _simulate(spec)
    if spec.dump == "midflight":
        t_dump = _midflight_time(job, sim, 11)
    else:
        t_dump = float("inf")
    docs = {}
    for r in range(job.world):
        if spec.culprit_dump == "absent" and r == spec.culprit:
            continue
        docs[r] = _dump_for_rank(job, sim, r, spec.fmt, spec.buffer, t_dump)
    return docs


def write_scenario(s: Scenario, directory: Path) -> Path:
    """Write ``rank_<r>`` files (pickle or JSON text) for every rank that has a dump; returns directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for r, doc in dump_documents(s).items():
        path = directory / f"rank_{r}"
        if s.fmt == "json":
            path.write_text(_to_json_text(doc))
        else:
            path.write_bytes(pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL))
    return directory
