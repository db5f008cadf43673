#!/usr/bin/env python3
"""Generate an N-rank set of realistic Kineto (torch.profiler) GPU traces, one file per rank.

Standalone: standard library only (events are formatted as text, which is faster than any JSON
encoder, so orjson is not needed). Deterministic for a given
``(ranks, steps, kernels_per_step, seed)``: the same arguments give byte-identical files on any
CPython 3.8+ (only ``random.Random.random()`` is drawn, and every number is formatted explicitly).

What a rank file looks like (the shape of real Kineto exports, see /work/shared/traces/gpu):

* top level: ``schemaVersion``, ``deviceProperties`` (8 x A100), ``distributedInfo``
  (``{"backend": "nccl", "rank": r, "world_size": N}``; written as ``"rank": r`` *with a space*,
  because Holistic Trace Analysis finds a file's rank with the regex ``"rank":\\s+(\\d+)``),
  ``record_shapes``, ``cupti_version``..., ``displayTimeUnit``, ``baseTimeNanoseconds``,
  ``traceEvents``, ``traceName``.
* ``ts``/``dur`` in microseconds relative to ``baseTimeNanoseconds``, with 3 decimals (ns).
* per training step (``ProfilerStep#k``, cat ``user_annotation``): a data-loader span (host-bound
  GPU idle), H2D copies (``cudaMemcpyAsync`` -> ``gpu_memcpy`` "Memcpy HtoD (Pinned -> Device)"),
  zero_grad memsets (``cudaMemsetAsync`` -> ``gpu_memset`` "Memset (Device)"), a forward pass of
  nested ``cpu_op`` events (aten::linear > aten::addmm, aten::relu > aten::clamp_min,
  aten::layer_norm > aten::native_layer_norm) launching kernels with ``cudaLaunchKernel``, a loss,
  a backward pass (autograd::engine::evaluate_function: ...), DDP gradient buckets all-reduced
  with ``nccl:all_reduce`` -> ``cudaEventRecord`` / ``cudaStreamWaitEvent`` / ``cudaLaunchKernel``
  -> ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` on the NCCL stream (partly overlapping the
  backward compute, and ending at the same time on every rank as a real collective does), an
  optimizer step (multi_tensor_apply_kernel), ``loss.item()`` (D2H copy + ``cudaStreamSynchronize``,
  which stalls the CPU), and every few steps a small side-stream prefetch copy.
* GPU events carry ``device``, ``context``, ``stream``, ``correlation``, ``External id`` and, for
  memcpy/memset, ``bytes`` and ``memory bandwidth (GB/s)``; each launch has an ``ac2g`` flow pair
  (``ph`` "s" on the runtime call, "f" with ``bp`` "e" on the GPU event).
* streams: 7 (compute), 20 (NCCL), 24 (side copy stream).

Timing model: the CPU thread advances op by op; a GPU event starts at
``max(launch + latency, previous end on its stream + 1-3 us, dependency)``, so where the CPU runs
ahead the GPU runs kernels back to back (kernel-wait gaps < 30 us), where it falls behind (data
loading, ``.item()`` sync, Python overhead spikes) the GPU idles with the CPU to blame (host wait),
and NCCL kernels wait for the gradients and for the slowest rank ("other" idle).

CLI::

    python bench/kineto_gpu_generator.py OUT_DIR --ranks 8 --gpu-events 1000000
    python bench/kineto_gpu_generator.py OUT_DIR --ranks 2 --steps 5 --kernels-per-step 120 --gz

``--gpu-events`` sizes the number of steps so that the set holds at least that many GPU events
(kernels + memcpy + memset) in total; otherwise ``--steps`` is used. The CLI prints a JSON summary.

From Python: ``generate(out_dir, ranks=2, steps=5, kernels_per_step=120, seed=0, compress=False)``
returns the same summary dict.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import math
import random
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

__all__ = ["generate", "gpu_events_per_step", "steps_for_gpu_events"]

BASE_TIME_NS = 1_735_000_000_000_000_000
# Kineto's ts are large (about 1e12 us past baseTimeNanoseconds in recent traces); keep that, so
# consumers see the same magnitudes (and HTA the same int64 columns) as with real traces.
TS_ORIGIN_US = 2_413_669_096_090.0
COMPUTE_STREAM = 7
NCCL_STREAM = 20
COPY_STREAM = 24
CONTEXT = 1

CBID = {
    "cudaLaunchKernel": 211, "cudaMemcpyAsync": 41, "cudaMemsetAsync": 51, "cudaStreamSynchronize": 131,
    "cudaStreamWaitEvent": 147, "cudaEventRecord": 135, "cudaEventQuery": 138, "cudaDeviceSynchronize": 165,
    "cudaPeekAtLastError": 11, "cudaStreamIsCapturing": 317,
}

# Real kernel names, as PyTorch 2.x / cuBLAS / NCCL 2.18+ emit them.
GEMM_KERNELS = [
    "ampere_sgemm_128x64_tn",
    "ampere_sgemm_128x128_nn",
    "ampere_sgemm_64x64_nt",
    "ampere_sgemm_32x32_sliced1x4_tn",
    "sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize64x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel",
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_16x4_tn_align4>(cutlass_80_tensorop_s1688gemm_128x128_16x4_tn_align4::Params)",
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x128_32x3_nn_align1>(cutlass_80_tensorop_s1688gemm_256x128_32x3_nn_align1::Params)",
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x128_32x3_nt_align1>(cutlass_80_tensorop_s1688gemm_256x128_32x3_nt_align1::Params)",
]
K_RELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)")
K_RELU_BWD = ("void at::native::vectorized_elementwise_kernel<4, at::native::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, at::detail::Array<char*, 3> >(int, at::native::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, at::detail::Array<char*, 3>)")
K_LAYER_NORM = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, float const*, float const*, float*, float*, float*)"
K_LAYER_NORM_BWD = "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<float, float>(float const*, float const*, float const*, float const*, float const*, float*, int)"
K_SUM = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)")
K_ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
K_MUL = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3>)")
K_FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
K_MSE = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4>)")
K_OPTIM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)")
K_COPY = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1})"
NCCL_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_ALLREDUCE_SIMPLE = "ncclDevKernel_AllReduce_Sum_f32_RING_SIMPLE(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_BROADCAST = "ncclDevKernel_Broadcast_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"

DEVICE_PROPS = {
    "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85049802752, "computeMajor": 8, "computeMinor": 0,
    "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
    "regsPerMultiprocessor": 65536, "warpSize": 32, "sharedMemPerBlock": 49152,
    "sharedMemPerMultiprocessor": 167936, "numSms": 108, "sharedMemPerBlockOptin": 166912,
}


def _f(x: float) -> str:
    return "%.3f" % x


def gpu_events_per_step(kernels_per_step: int) -> int:
    """GPU events (kernels + memcpy + memset, incl. NCCL) one rank emits per step (excl. prefetch)."""
    return _Plan(kernels_per_step).gpu_events_per_step


def steps_for_gpu_events(total_gpu_events: int, ranks: int, kernels_per_step: int) -> int:
    per_rank = math.ceil(total_gpu_events / max(1, ranks))
    return max(2, math.ceil(per_rank / gpu_events_per_step(kernels_per_step)))


class _Plan:
    """Model shape (layers, buckets) derived from kernels_per_step; identical on every rank."""

    def __init__(self, kernels_per_step: int, seed: int = 0) -> None:
        k = max(20, int(kernels_per_step))
        # per layer: fwd gemm + relu (+ layer_norm every 4th) and bwd 2 gemms + relu bwd + bias sum
        # + accumulate-grad add, i.e. about 7.25 kernels; fixed: loss 3, optimizer 4, misc 2.
        self.layers = max(2, int(round((k - 9) / 7.25)))
        self.bucket = 4  # layers per DDP gradient bucket
        rng = random.Random(seed * 7919 + 17)
        self.gemm = [(GEMM_KERNELS[int(rng.random() * len(GEMM_KERNELS))],
                      GEMM_KERNELS[int(rng.random() * len(GEMM_KERNELS))],
                      GEMM_KERNELS[int(rng.random() * len(GEMM_KERNELS))]) for _ in range(self.layers)]
        # per-layer cost scale (us for the forward gemm)
        self.size = [20.0 + 180.0 * rng.random() for _ in range(self.layers)]
        self.n_buckets = math.ceil(self.layers / self.bucket)
        # gradient elements per bucket (same on every rank); the last bucket (first layers) is big
        self.bucket_nelems = [262_144 * (1 + int(rng.random() * 4)) for _ in range(self.n_buckets - 1)] + [1_048_576]
        self.n_layer_norm = sum(1 for i in range(self.layers) if i % 4 == 3)
        self.gpu_events_per_step = (
            2  # H2D copies
            + 2  # zero_grad memsets
            + self.layers * 2 + self.n_layer_norm  # forward
            + 3  # loss fwd+bwd (mse, mul, fill)
            + self.layers * 5 + self.n_layer_norm  # backward
            + self.n_buckets  # all-reduces
            + 4  # optimizer
            + 1  # loss.item() D2H
        )


class _Rank:
    """One rank's CPU/GPU timeline writer."""

    def __init__(self, rank: int, world: int, plan: _Plan, seed: int, fh) -> None:
        self.rank = rank
        self.world = world
        self.plan = plan
        self.rng = random.Random(seed * 1_000_003 + rank * 7_919 + 1)
        self.fh = fh
        self.first = True
        self.pid = 40_000 + 97 * rank
        self.tid = self.pid
        self.device = rank % 8
        self.cpu = TS_ORIGIN_US + 3.0 * rank  # us since baseTimeNanoseconds
        self.t_begin = self.cpu - 50.0
        self.stream_free: Dict[int, float] = {COMPUTE_STREAM: self.cpu, NCCL_STREAM: self.cpu, COPY_STREAM: self.cpu}
        self.corr = 100 * rank + 5
        self.ext = 1
        self.ev_idx = 0
        self.gpu_events = 0
        self.buf: List[str] = []
        self.last_event_end = self.cpu

    # ---- low level -------------------------------------------------------------------------
    def r(self) -> float:
        return self.rng.random()

    def jit(self, x: float, frac: float = 0.1) -> float:
        return x * (1.0 - frac + 2.0 * frac * self.r())

    def emit(self, s: str) -> None:
        self.buf.append(s)

    def flush(self) -> None:
        if not self.buf:
            return
        text = ",\n".join(self.buf)
        if self.first:
            self.fh.write(text)
            self.first = False
        else:
            self.fh.write(",\n" + text)
        self.buf.clear()

    def next_ext(self) -> int:
        self.ext += 1
        return self.ext

    def cpu_span(self, cat: str, name: str, ts: float, dur: float, ext: int, extra: str = "") -> None:
        self.ev_idx += 1
        self.emit(
            '  {"ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d, "ts": %s, "dur": %s, '
            '"args": {"External id": %d, "Record function id": 0, "Ev Idx": %d%s}}'
            % (cat, name, self.pid, self.tid, _f(ts), _f(dur), ext, self.ev_idx, extra))
        self.last_event_end = max(self.last_event_end, ts + dur)

    def runtime(self, name: str, ts: float, dur: float, ext: int, corr: Optional[int] = None) -> int:
        if corr is None:
            self.corr += 1
            corr = self.corr
        self.emit(
            '  {"ph": "X", "cat": "cuda_runtime", "name": "%s", "pid": %d, "tid": %d, "ts": %s, "dur": %s, '
            '"args": {"External id": %d, "cbid": %d, "correlation": %d}}'
            % (name, self.pid, self.tid, _f(ts), _f(dur), ext, CBID[name], corr))
        self.last_event_end = max(self.last_event_end, ts + dur)
        return corr

    def gpu_event(self, cat: str, name: str, stream: int, ts: float, dur: float, ext: int, corr: int,
                  extra: str) -> None:
        self.emit(
            '  {"ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d, "ts": %s, "dur": %s, '
            '"args": {"External id": %d, %s"device": %d, "context": %d, "stream": %d, "correlation": %d%s}}'
            % (cat, name, self.device, stream, _f(ts), _f(dur), ext,
               '"queued": 0, ' if cat == "kernel" else "", self.device, CONTEXT, stream, corr, extra))
        self.gpu_events += 1
        self.last_event_end = max(self.last_event_end, ts + dur)

    def flow(self, corr: int, ts_cpu: float, ts_gpu: float, stream: int) -> None:
        self.emit('  {"ph": "s", "id": %d, "pid": %d, "tid": %d, "ts": %s, "cat": "ac2g", "name": "ac2g"}'
                  % (corr, self.pid, self.tid, _f(ts_cpu)))
        self.emit('  {"ph": "f", "id": %d, "pid": %d, "tid": %d, "ts": %s, "cat": "ac2g", "name": "ac2g", "bp": "e"}'
                  % (corr, self.device, stream, _f(ts_gpu)))

    # ---- launches ----------------------------------------------------------------------------
    def _start(self, stream: int, t_rt: float, rt_dur: float, not_before: float) -> float:
        gap = 1.0 + 2.0 * self.r()
        if self.r() < 0.02:
            gap += 5.0 + 60.0 * self.r()  # occasional scheduling hiccup on the device
        lat = 4.0 + 4.0 * self.r()
        return max(t_rt + lat, self.stream_free[stream] + gap, not_before)

    def launch(self, kname: str, gpu_dur: float, ext: int, stream: int = COMPUTE_STREAM,
               not_before: float = 0.0, extra: str = "", grid: Tuple[int, int, int] = (0, 0, 0)) -> Tuple[float, float]:
        t_rt = self.cpu + 0.5 + self.r()
        rt_dur = 3.0 + 5.0 * self.r()
        if self.r() < 0.01:
            rt_dur += 20.0 + 80.0 * self.r()  # a slow launch
        corr = self.runtime("cudaLaunchKernel", t_rt, rt_dur, ext)
        start = self._start(stream, t_rt, rt_dur, not_before)
        end = start + gpu_dur
        self.stream_free[stream] = end
        g = grid if grid[0] else (1 + int(self.r() * 1024), 1, 1)
        regs = (32, 40, 64, 96, 128)[int(self.r() * 5)]
        self.gpu_event("kernel", kname, stream, start, gpu_dur, ext, corr,
                       ', "registers per thread": %d, "shared memory": %d, "blocks per SM": %s, "warps per SM": %s, '
                       '"grid": [%d, %d, %d], "block": [%d, 1, 1], "est. achieved occupancy %%": %d%s'
                       % (regs, (0, 4096, 16384, 49152)[int(self.r() * 4)], "%.6f" % (g[0] / 108.0),
                          "%.6f" % (g[0] * 4 / 108.0), g[0], g[1], g[2], 128, int(10 + 90 * self.r()), extra))
        self.flow(corr, t_rt, start, stream)
        self.cpu = t_rt + rt_dur
        return start, end

    def memcpy(self, kind: str, nbytes: int, gbps: float, ext: int, stream: int = COMPUTE_STREAM) -> Tuple[float, float]:
        t_rt = self.cpu + 0.5 + self.r()
        rt_dur = 4.0 + 6.0 * self.r()
        corr = self.runtime("cudaMemcpyAsync", t_rt, rt_dur, ext)
        dur = max(0.6, nbytes / (gbps * 1e3))
        start = self._start(stream, t_rt, rt_dur, 0.0)
        self.stream_free[stream] = start + dur
        self.gpu_event("gpu_memcpy", kind, stream, start, dur, ext, corr,
                       ', "bytes": %d, "memory bandwidth (GB/s)": %r' % (nbytes, nbytes / (dur * 1e3)))
        self.flow(corr, t_rt, start, stream)
        self.cpu = t_rt + rt_dur
        return start, start + dur

    def memset(self, nbytes: int, ext: int, stream: int = COMPUTE_STREAM) -> None:
        t_rt = self.cpu + 0.5 + self.r()
        rt_dur = 3.0 + 4.0 * self.r()
        corr = self.runtime("cudaMemsetAsync", t_rt, rt_dur, ext)
        dur = 0.7 + nbytes / 400e3 + 1.5 * self.r()  # sub-us to a few us, like real memsets
        start = self._start(stream, t_rt, rt_dur, 0.0)
        self.stream_free[stream] = start + dur
        self.gpu_event("gpu_memset", "Memset (Device)", stream, start, dur, ext, corr,
                       ', "bytes": %d, "memory bandwidth (GB/s)": %r' % (nbytes, nbytes / (dur * 1e3)))
        self.flow(corr, t_rt, start, stream)
        self.cpu = t_rt + rt_dur

    # ---- op helpers --------------------------------------------------------------------------
    def op(self, name: str, kernels: List[Tuple[str, float]], pre: float = 6.0, cat: str = "cpu_op",
           children: Tuple[str, ...] = (), launcher: str = "", shapes: str = "") -> Tuple[float, float]:
        """A cpu_op launching `kernels` [(name, gpu_us)]: first the kernel-less `children` (e.g.
        aten::t), then the launches, inside a child span `launcher` (e.g. aten::addmm) if given."""
        ext = self.next_ext()
        ts = self.cpu
        self.cpu += self.jit(pre, 0.5)
        first_start = last_end = 0.0
        child_spans = []
        for cname in children:
            cts = self.cpu
            self.cpu += 1.5 + 3.0 * self.r()
            child_spans.append((cname, cts, self.cpu - cts, self.next_ext()))
            self.cpu += 0.3
        l_ts, l_ext = self.cpu, (self.next_ext() if launcher else ext)
        if launcher:
            self.cpu += 1.0 + 2.0 * self.r()
        for kname, kdur in kernels:
            s, e = self.launch(kname, self.jit(kdur, 0.08), l_ext)
            first_start = first_start or s
            last_end = e
            self.cpu += 1.0 + 2.0 * self.r()
        if launcher:
            self.cpu += 0.5
            child_spans.append((launcher, l_ts, self.cpu - l_ts, l_ext))
        if self.r() < 0.005:
            self.cpu += 100.0 + 900.0 * self.r()  # python / allocator hiccup: host-bound idle
        self.cpu += 1.0 + self.r()
        extra = shapes or ', "Input Dims": [[64, 1024], [1024, 1024]], "Input type": ["float", "float"]'
        self.cpu_span(cat, name, ts, self.cpu - ts, ext, extra)
        for cname, cts, cdur, cext in child_spans:
            self.cpu_span("cpu_op", cname, cts, cdur, cext, ', "Input Dims": [[64, 1024], [1024, 1024]]')
        self.cpu += 0.5 + self.r()
        return first_start, last_end

    # ---- one training step, a generator that yields at each collective ------------------------
    def step(self, k: int, prefetch: bool) -> Iterator[Tuple[str, float]]:
        p = self.plan
        step_ts = self.cpu
        step_ext = self.next_ext()
        # data loader (host-bound GPU idle): usually 0.3-1.5 ms, sometimes much longer
        dl = 300.0 + 1200.0 * self.r()
        if self.r() < 0.15:
            dl += 2000.0 + 4000.0 * self.r()
        self.cpu_span("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                      self.cpu + 2.0, dl, self.next_ext())
        self.cpu += dl + 4.0
        # H2D of the batch
        for nbytes in (4_194_304, 65_536):
            ext = self.next_ext()
            ts = self.cpu
            self.cpu += 3.0
            self.memcpy("Memcpy HtoD (Pinned -> Device)", nbytes, 18.0 + 6.0 * self.r(), ext)
            self.cpu += 2.0
            self.cpu_span("cpu_op", "aten::copy_", ts, self.cpu - ts, ext,
                          ', "Input Dims": [[64, 1024], [64, 1024], []], "Input type": ["float", "float", "Scalar"]')
        if prefetch:  # next batch prefetched on a side stream, overlapping compute (MEMORY || COMPUTATION)
            ext = self.next_ext()
            ts = self.cpu
            self.cpu += 2.0
            self.memcpy("Memcpy HtoD (Pinned -> Device)", 16_777_216, 20.0, ext, stream=COPY_STREAM)
            self.cpu_span("cpu_op", "aten::copy_", ts, self.cpu - ts + 1.0, ext)
            self.cpu += 2.0
        # zero_grad
        zg_ts = self.cpu
        zg_ext = self.next_ext()
        for _ in range(2):
            ext = self.next_ext()
            ts = self.cpu
            self.cpu += 2.0
            self.memset(262_144 if self.r() < 0.5 else 512, ext)
            self.cpu += 1.0
            self.cpu_span("cpu_op", "aten::zero_", ts, self.cpu - ts, ext)
        self.cpu_span("user_annotation", "Optimizer.zero_grad#SGD.zero_grad", zg_ts, self.cpu - zg_ts + 1.0, zg_ext)
        self.cpu += 2.0
        # forward
        for i in range(p.layers):
            g = p.gemm[i]
            self.op("aten::linear", [(g[0], p.size[i])], pre=8.0, children=("aten::t",), launcher="aten::addmm")
            self.op("aten::relu", [(K_RELU, 4.0 + p.size[i] * 0.05)], pre=5.0, launcher="aten::clamp_min")
            if i % 4 == 3:
                self.op("aten::layer_norm", [(K_LAYER_NORM, 6.0 + p.size[i] * 0.04)], pre=7.0,
                        launcher="aten::native_layer_norm")
        self.op("aten::mse_loss", [(K_MSE, 9.0)], pre=9.0, launcher="aten::mean")
        # backward
        bwd_ts = self.cpu
        self.op("autograd::engine::evaluate_function: MseLossBackward0", [(K_MUL, 3.0), (K_FILL, 2.0)], pre=10.0,
                launcher="MseLossBackward0")
        done_layers = 0
        bucket_idx = 0
        for i in reversed(range(p.layers)):
            g = p.gemm[i]
            if i % 4 == 3:
                self.op("autograd::engine::evaluate_function: NativeLayerNormBackward0",
                        [(K_LAYER_NORM_BWD, 8.0 + p.size[i] * 0.06)], pre=9.0,
                        launcher="aten::native_layer_norm_backward")
            self.op("autograd::engine::evaluate_function: ReluBackward0", [(K_RELU_BWD, 4.0 + p.size[i] * 0.06)], pre=8.0,
                    launcher="aten::threshold_backward")
            self.op("autograd::engine::evaluate_function: AddmmBackward0",
                    [(g[1], p.size[i] * 1.05), (g[2], p.size[i] * 0.95), (K_SUM, 3.0 + p.size[i] * 0.02)],
                    pre=12.0, children=("aten::t",), launcher="AddmmBackward0")
            self.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", [(K_ADD, 3.0)], pre=6.0,
                    launcher="aten::add_")
            done_layers += 1
            if done_layers % p.bucket == 0 or i == 0:
                # DDP bucket ready: all-reduce on the NCCL stream after the gradients are computed
                ext = self.next_ext()
                ts = self.cpu
                self.cpu += 5.0
                self.runtime("cudaEventRecord", self.cpu, 3.0 + 2.0 * self.r(), ext)
                ready_dep = self.stream_free[COMPUTE_STREAM]
                self.cpu += 5.0
                self.runtime("cudaStreamWaitEvent", self.cpu, 2.0 + 2.0 * self.r(), ext)
                self.cpu += 4.0
                t_rt = self.cpu + 0.5
                rt_dur = 4.0 + 5.0 * self.r()
                # the collective starts on this rank when launched and the gradients are there
                start = max(t_rt + 5.0, self.stream_free[NCCL_STREAM] + 2.0, ready_dep + 1.0)
                nelems = p.bucket_nelems[min(bucket_idx, p.n_buckets - 1)]
                bucket_idx += 1
                # every rank reports its start; the driver answers with the common end time
                end = yield ("allreduce", start, nelems)
                big = nelems >= 1_048_576
                kname = NCCL_ALLREDUCE_SIMPLE if big else NCCL_ALLREDUCE
                corr = self.runtime("cudaLaunchKernel", t_rt, rt_dur, ext)
                dur = end - start
                self.stream_free[NCCL_STREAM] = end
                extra = (', "Collective name": "allreduce", "In msg nelems": %d, "Out msg nelems": %d, '
                         '"Group size": %d, "dtype": "Float", "Process Group Name": "0", '
                         '"Process Group Description": "default_pg", "Process Group Ranks": "[%s]"'
                         % (nelems, nelems, self.world, ", ".join(str(x) for x in range(self.world))))
                self.gpu_event("kernel", kname, NCCL_STREAM, start, dur, ext, corr,
                               ', "registers per thread": 96, "shared memory": 41744, "blocks per SM": 0.222222, '
                               '"warps per SM": 3.777778, "grid": [24, 1, 1], "block": [544, 1, 1], '
                               '"est. achieved occupancy %%": 6%s' % extra)
                self.flow(corr, t_rt, start, NCCL_STREAM)
                self.cpu = t_rt + rt_dur + 2.0
                self.cpu_span("user_annotation", "nccl:all_reduce", ts + 1.0, self.cpu - ts - 1.0, self.next_ext())
                self.cpu_span("cpu_op", "record_param_comms", ts, self.cpu - ts + 1.0, ext,
                              ', "Collective name": "allreduce", "dtype": "Float", "In msg nelems": %d, '
                              '"Out msg nelems": %d, "Group size": %d' % (nelems, nelems, self.world))
                self.cpu += 3.0
        self.cpu_span("cpu_op", "autograd::engine::evaluate_function: backward", bwd_ts, self.cpu - bwd_ts, self.next_ext())
        # DDP: the compute stream waits for the last all-reduce before the optimizer
        ext = self.next_ext()
        self.runtime("cudaStreamWaitEvent", self.cpu + 1.0, 2.5, ext)
        self.cpu += 5.0
        wait_nccl = self.stream_free[NCCL_STREAM]
        # optimizer step
        opt_ts = self.cpu
        opt_ext = self.next_ext()
        for j in range(4):
            ext = self.next_ext()
            ts = self.cpu
            self.cpu += 6.0
            s, e = self.launch(K_OPTIM if j % 2 == 0 else K_MUL, 25.0 + 15.0 * self.r(), ext,
                               not_before=wait_nccl + 2.0 if j == 0 else 0.0)
            self.cpu += 2.0
            self.cpu_span("cpu_op", "aten::_foreach_add_" if j % 2 == 0 else "aten::_foreach_mul_", ts, self.cpu - ts, ext)
        self.cpu_span("user_annotation", "Optimizer.step#SGD.step", opt_ts, self.cpu - opt_ts + 1.0, opt_ext)
        self.cpu += 3.0
        # loss.item(): D2H copy then the CPU blocks until the compute stream drains
        ext = self.next_ext()
        ts = self.cpu
        self.cpu += 4.0
        _, e = self.memcpy("Memcpy DtoH (Device -> Pageable)", 4, 0.002 + 0.004 * self.r(), ext)
        sync_ts = self.cpu + 1.0
        sync_dur = max(3.0, self.stream_free[COMPUTE_STREAM] - sync_ts + 4.0)
        self.runtime("cudaStreamSynchronize", sync_ts, sync_dur, ext)
        self.cpu = sync_ts + sync_dur + 2.0
        self.cpu_span("cpu_op", "aten::item", ts, self.cpu - ts, ext, ', "Input Dims": [[]], "Input type": ["float"]')
        self.cpu += 5.0 + 20.0 * self.r()
        self.cpu_span("user_annotation", "ProfilerStep#%d" % k, step_ts, self.cpu - step_ts, step_ext)
        self.cpu += 2.0
        self.flush()


def _header(rank: int, world: int) -> str:
    devs = [dict(id=i, **DEVICE_PROPS) for i in range(8)]
    head = {
        "schemaVersion": 1,
        "deviceProperties": devs,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": 1,
                            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                           "pg_size": world, "ranks": list(range(world))}],
                            "nccl_version": "2.21.5"},
        "record_shapes": 1,
        "with_stack": 0,
        "cupti_version": 24,
        "cuda_runtime_version": 12040,
        "cuda_driver_version": 12040,
        "trace_id": "%016X" % (0x5EED0000 + rank),
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_TIME_NS,
    }
    body = json.dumps(head, indent=2)  # keeps '"rank": N' with a space, as Kineto does
    return body[:-2] + ',\n  "traceEvents": [\n'


def _metadata_events(r: _Rank, ts: float) -> List[str]:
    t = _f(ts)
    ev = [
        {"name": "process_name", "ph": "M", "ts": t, "pid": r.pid, "tid": 0, "args": {"name": "python3"}},
        {"name": "process_labels", "ph": "M", "ts": t, "pid": r.pid, "tid": 0, "args": {"labels": "CPU"}},
        {"name": "process_sort_index", "ph": "M", "ts": t, "pid": r.pid, "tid": 0, "args": {"sort_index": r.pid}},
        {"name": "thread_name", "ph": "M", "ts": t, "pid": r.pid, "tid": r.tid, "args": {"name": "thread %d (python3)" % r.tid}},
        {"name": "thread_sort_index", "ph": "M", "ts": t, "pid": r.pid, "tid": r.tid, "args": {"sort_index": r.tid}},
        {"name": "process_name", "ph": "M", "ts": t, "pid": r.device, "tid": 0, "args": {"name": "python3"}},
        {"name": "process_labels", "ph": "M", "ts": t, "pid": r.device, "tid": 0, "args": {"labels": "GPU %d" % r.device}},
        {"name": "process_sort_index", "ph": "M", "ts": t, "pid": r.device, "tid": 0, "args": {"sort_index": 16777216 + r.device}},
    ]
    for s in (COMPUTE_STREAM, NCCL_STREAM, COPY_STREAM):
        ev.append({"name": "thread_name", "ph": "M", "ts": t, "pid": r.device, "tid": s, "args": {"name": "stream %d " % s}})
        ev.append({"name": "thread_sort_index", "ph": "M", "ts": t, "pid": r.device, "tid": s, "args": {"sort_index": s}})
    return ["  " + json.dumps(e).replace('"ts": "%s"' % t, '"ts": %s' % t) for e in ev]


def _trailer(r: _Rank) -> str:
    t0, t1 = r.t_begin, r.last_event_end + 20.0
    ev = [
        '  {"ph": "X", "cat": "Trace", "ts": %s, "dur": %s, "pid": "Spans", "tid": "PyTorch Profiler", '
        '"name": "PyTorch Profiler (0)", "args": {"Op count": 0}}' % (_f(t0), _f(t1 - t0)),
        '  {"name": "process_sort_index", "ph": "M", "ts": %s, "pid": "Spans", "tid": 0, "args": {"sort_index": 536870912}}' % _f(t0),
        '  {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": %s}' % _f(t0),
        '  {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": %s}' % _f(t1),
    ]
    r.buf.extend(ev)
    r.flush()
    return '\n  ],\n  "traceName": "rank%d.json"\n}\n' % r.rank


def generate(out_dir, ranks: int = 2, steps: int = 5, kernels_per_step: int = 120, seed: int = 0,
             compress: bool = False, prefetch_every: int = 3) -> Dict:
    """Write rank{r}.json[.gz] for r in range(ranks) into out_dir; return a summary dict."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = _Plan(kernels_per_step, seed)
    suffix = ".json.gz" if compress else ".json"
    paths = [out / ("rank%d%s" % (r, suffix)) for r in range(ranks)]
    handles = []
    for p in paths:
        if compress:
            # mtime=0 keeps the .gz bytes reproducible
            raw = open(p, "wb")
            gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=1, mtime=0)
            handles.append((io.TextIOWrapper(gz, encoding="utf-8"), gz, raw))
        else:
            handles.append((open(p, "w", encoding="utf-8"), None, None))
    sims = [_Rank(r, ranks, plan, seed, handles[r][0]) for r in range(ranks)]
    for s in sims:
        s.fh.write(_header(s.rank, ranks))
        s.buf.extend(_metadata_events(s, s.t_begin))
        s.flush()
    rng = random.Random(seed * 31 + 7)
    first_step = 1 + int(rng.random() * 20)
    for k in range(first_step, first_step + steps):
        gens = [s.step(k, prefetch=(prefetch_every > 0 and (k - first_step) % prefetch_every == 1)) for s in sims]
        msgs = [next(g, None) for g in gens]
        while any(m is not None for m in msgs):
            # every rank is at the same collective (same model): common end time
            live = [(i, m) for i, m in enumerate(msgs) if m is not None]
            latest = max(m[1] for _, m in live)
            nelems = live[0][1][2]
            transfer = 30.0 + nelems * 4 / 1e9 * 2 * (ranks - 1) / max(ranks, 1) / 150.0 * 1e6  # ~150 GB/s bus
            end = latest + transfer * (0.9 + 0.2 * rng.random())
            new = []
            for i, m in enumerate(msgs):
                if m is None:
                    new.append(None)
                    continue
                try:
                    new.append(gens[i].send(end + 0.4 * rng.random()))
                except StopIteration:
                    new.append(None)
            msgs = new
    summary = {"ranks": ranks, "steps": steps, "kernels_per_step": kernels_per_step, "seed": seed,
               "compress": compress, "first_step": first_step, "files": [], "gpu_events": 0}
    for s, (fh, gz, raw) in zip(sims, handles):
        s.flush()
        fh.write(_trailer(s))
        fh.close()
        if gz is not None:
            gz.close()
            raw.close()
        summary["gpu_events"] += s.gpu_events
    for p in paths:
        # sha256 of the JSON text (decompressed for .gz: zlib builds may differ in compressed bytes)
        h = hashlib.sha256()
        with (gzip.open(p, "rb") if compress else open(p, "rb")) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        summary["files"].append({"name": p.name, "bytes": p.stat().st_size, "sha256": h.hexdigest()})
    return summary


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6, help="steps per rank (ignored with --gpu-events)")
    ap.add_argument("--kernels-per-step", type=int, default=120)
    ap.add_argument("--gpu-events", type=int, default=0, help="size the set to at least this many GPU events in total")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gz", action="store_true", help="write rank{r}.json.gz instead of rank{r}.json")
    args = ap.parse_args(argv)
    steps = args.steps
    if args.gpu_events > 0:
        steps = steps_for_gpu_events(args.gpu_events, args.ranks, args.kernels_per_step)
    summary = generate(args.out_dir, ranks=args.ranks, steps=steps, kernels_per_step=args.kernels_per_step,
                       seed=args.seed, compress=args.gz)
    json.dump(summary, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
