"""HTA 0.5.0's last-step rule on traces small enough to work out by hand (hta/common/trace.py
``_filter_irrelevant_gpu_kernels``): which events its loader keeps, with and without
``include_last_profiler_step``, and what happens to a rank that has no ProfilerStep of its own.
Times in microseconds; every trace has profiler steps at 0-100, 100-200 and 200-300."""

from __future__ import annotations

import json
from pathlib import Path

from rankstream.flows.trace_analysis import analyze_trace_files

US = 1000


def _event(name, cat, ts, dur, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}


def _steps() -> list[dict]:
    return [_event(f"ProfilerStep#{k}", "user_annotation", 100 * (k - 1), 100) for k in (1, 2, 3)]


def _launched(corr: int, call_ts: int, name: str, ts: int, dur: int, stream: int = 7) -> list[dict]:
    return [_event("cudaLaunchKernel", "cuda_runtime", call_ts, 2, correlation=corr),
            _event(name, "kernel", ts, dur, stream=stream, correlation=corr)]


def _write(path: Path, rank: int, events: list[dict]) -> Path:
    path.write_text(json.dumps({"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": events}))
    return path


def _kernels(tables: dict, rank: int = 0) -> dict[str, tuple[int, int]]:
    """Kernel name -> (calls, total time in ns) on ``rank``."""
    return {r["name"]: (r["count"], r["sum_ns"]) for r in tables["gpu_kernel_breakdown"] if r["rank"] == rank}


def _orphan(name: str, ts: int, dur: int) -> dict:
    """A GPU event whose launch call is not in the trace (the profiler started after it)."""
    return _event(name, "kernel", ts, dur, stream=7, correlation=999)


def test_an_event_with_a_stream_but_no_correlation_is_cut_as_a_cpu_event_and_counted_as_gpu_work(tmp_path):
    """HTA's loader takes an event as a GPU kernel only with a stream and a correlation id; a Triton
    ``cpu_op`` with a stream and no correlation is kept with the CPU events that start before the last
    step, and the analyses, which look at the stream, then count it as GPU work."""
    events = _steps() + _launched(1, 10, "gemm_kernel", 20, 40)
    events += [_event("triton_poi_fused_1", "cpu_op", 30, 10, stream=7),
               _event("triton_poi_fused_1", "cpu_op", 230, 10, stream=7)]  # in the last step: cut
    tables = analyze_trace_files([_write(tmp_path / "rank0.json", 0, events)]).tables
    assert _kernels(tables) == {"gemm_kernel": (1, 40 * US), "triton_poi_fused_1": (1, 10 * US)}


def test_keeping_the_last_step_still_keeps_only_gpu_events_whose_launch_is_kept(tmp_path):
    """``include_last_profiler_step=True`` moves the CPU cut-off to the end of the last step (its
    launches are kept, a launch after it is not) and keeps the correlation check: an event whose
    launch is not in the trace is dropped either way."""
    events = _steps() + _launched(1, 10, "k_step_1", 20, 40) + _launched(2, 250, "k_last_step", 260, 10)
    events += _launched(3, 350, "k_after_the_steps", 360, 10) + [_orphan("k_orphan", 150, 10)]
    trace = _write(tmp_path / "rank0.json", 0, events)
    assert set(_kernels(analyze_trace_files([trace]).tables)) == {"k_step_1"}
    assert set(_kernels(analyze_trace_files([trace], keep_last_step=True).tables)) == {"k_step_1", "k_last_step"}


def test_a_rank_without_profiler_steps_is_not_cut_and_the_note_says_so(tmp_path):
    """HTA fails on a run where one rank has ProfilerSteps and another has none. Here that rank is
    taken as HTA takes a single file without steps (nothing cut: all its events count) and named
    in the note, never left out."""
    with_steps = _steps() + _launched(1, 10, "k_step_1", 20, 40) + _launched(2, 250, "k_last_step", 260, 10)
    without_steps = (_launched(1, 10, "k_early", 20, 40) + _launched(2, 250, "k_late", 260, 10)
                     + [_orphan("k_orphan", 150, 10)])
    files = [_write(tmp_path / "rank0.json", 0, with_steps), _write(tmp_path / "rank1.json", 1, without_steps)]
    analysis = analyze_trace_files(files)
    assert {r["rank"] for r in analysis.tables["gpu_temporal_breakdown"]} == {0, 1}
    assert set(_kernels(analysis.tables, 0)) == {"k_step_1"}
    assert set(_kernels(analysis.tables, 1)) == {"k_early", "k_late", "k_orphan"}
    assert "rank 1" in analysis.note and "ProfilerStep" in analysis.note
    assert "rank 0" not in analysis.note
