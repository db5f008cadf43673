"""The per-stream GPU analyses (idle time, queue length, launches, memory bandwidth) against the
figures Holistic Trace Analysis 0.5.0 printed on real and generated traces
(tests/data/hta_expected.json, recorded by bench/hta_record.py), and the communication each step
leaves exposed on a trace small enough to work out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rankstream.flows.gpu_streams import LAUNCH_CALLS
from rankstream.flows.intervals import covered_ns, merged_intervals
from rankstream.flows.trace_analysis import analyze_trace_files
from rankstream.schemas.errors import BadInput
from tests.unit.test_gpu_breakdown import CASES, EXPECTED, _files

US = 1000
#: The launch calls HTA 0.5.0's launch stats look at (it skips cuLaunchKernel and the hip* calls).
HTA_LAUNCH_CALLS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemsetAsync", "cudaMemcpyAsync",
                    "runFunction - job_prep_and_submit_for_execution"}


def _hta_rows(name: str, analysis: str) -> list[dict] | None:
    """HTA's rows for every rank (its default is rank 0 only), or None where HTA gave no table."""
    results = EXPECTED["directories"][name]["results"]
    table = results.get(f"{analysis}@all_ranks", results.get(analysis))
    if not isinstance(table, dict) or "rows" not in table:
        return None
    return [dict(zip(table["columns"], row)) for row in table["rows"]]


@pytest.fixture(scope="module")
def analyses(tmp_path_factory):
    """Each case analysed once for every test of this module."""
    done = {}

    def get(name):
        if name not in done:
            done[name] = analyze_trace_files(_files(name, tmp_path_factory.mktemp(name.replace("/", "_"))))
        return done[name]
    return get


@pytest.mark.parametrize("name", CASES)
def test_idle_time_breakdown_matches_hta(name, analyses):
    ours = {(r["rank"], r["stream"], r["idle_category"]): r for r in analyses(name).tables.get("gpu_idle_time", [])}
    theirs = _hta_rows(name, "idle_time_breakdown") or []
    assert set(ours) == {(r["rank"], r["stream"], r["idle_category"]) for r in theirs}
    for row in theirs:
        mine = ours[row["rank"], row["stream"], row["idle_category"]]
        assert mine["idle_time"] == pytest.approx(row["idle_time"] * US, abs=US), row
        assert (mine["idle_time_ratio"] or 0) == pytest.approx(row["idle_time_ratio"] or 0, abs=0.006), row


@pytest.mark.parametrize("name", CASES)
def test_queue_length_summary_matches_hta(name, analyses):
    """Counts and extremes exactly; the mean within 1% (HTA's order of a launch and an event start at
    the same microsecond is its sort's, not defined)."""
    ours = {(r["rank"], r["stream"]): r for r in analyses(name).tables.get("gpu_queue_length", [])}
    theirs = _hta_rows(name, "queue_length_summary") or []
    assert set(ours) == {(r["rank"], r["stream"]) for r in theirs}
    for row in theirs:
        mine = ours[row["rank"], row["stream"]]
        assert (mine["count"], mine["min"], mine["max"]) == (row["count"], row["min"], row["max"]), row
        assert mine["mean"] == pytest.approx(row["mean"], rel=0.01), row


@pytest.mark.parametrize("name", CASES)
def test_kernel_launch_stats_match_hta_and_count_the_launch_calls_hta_skips(name, analyses, tmp_path):
    from rankstream.flows.merge_traces import RUN_ID, scratch_run
    from rankstream.flows.gpu_breakdown import analyze_gpu_breakdown

    files = _files(name, tmp_path)
    rank = 0 if len(files) == 1 and name in ("amd_trace", "triton_example") else None
    with scratch_run(files, rank=rank) as (database, _):
        analyze_gpu_breakdown(database, RUN_ID)
        launches = database.arrow("SELECT * FROM gpu_kernel_launches").to_pylist()
    results = EXPECTED["directories"][name]["results"]
    per_rank = results.get("cuda_kernel_launch_stats@all_ranks", results.get("cuda_kernel_launch_stats"))
    theirs = {(int(rank), row[0]): row for rank, table in per_rank.items() if isinstance(table, dict)
              for row in table.get("rows", [])}
    ours = {(r["rank"], r["correlation"]): r for r in launches if r["launch_call"] in HTA_LAUNCH_CALLS}
    assert set(ours) == set(theirs)
    for key, (_, cpu_duration, gpu_duration, launch_delay) in theirs.items():
        mine = ours[key]
        assert (mine["cpu_duration"], mine["gpu_duration"], mine["launch_delay"]) == (
            cpu_duration * US, gpu_duration * US, launch_delay * US), key
        assert mine["long_launch_call"] == (cpu_duration > 50) and mine["long_launch_delay"] == (launch_delay > 100)
    assert {r["launch_call"] for r in launches} <= set(LAUNCH_CALLS)
    if name == "amd_trace":  # HTA's launch stats are empty on ROCm; these are not
        assert launches and all(r["launch_call"].startswith("hip") for r in launches)


@pytest.mark.parametrize("name", CASES)
def test_memory_bandwidth_matches_hta_where_its_order_of_simultaneous_events_does_not_matter(name, analyses):
    """HTA sums the bandwidth of events in its sort's order of equal timestamps and keeps float
    residues (4e-15 GB/s where nothing runs) as points. Here each instant is one point and residues
    are not bandwidth, so: the peak is never above HTA's (HTA passes through every value here), the
    bandwidth integrated over the points agrees within 2%, and where no two points share an
    instant (HTA's count minus its residues equals ours) the peak is HTA's."""
    ours = {(r["rank"], r["name"]): r for r in analyses(name).tables.get("gpu_memory_bandwidth", [])}
    theirs = [r for r in _hta_rows(name, "memory_bw_summary") or [] if r["max"] > 1e-9]
    assert set(ours) == {(r["rank"], r["name"]) for r in theirs}
    for row in theirs:
        mine = ours[row["rank"], row["name"]]
        assert mine["max"] <= row["max"] * (1 + 1e-6), row  # HTA recorded 9 digits
        assert mine["count"] * mine["mean"] == pytest.approx(row["count"] * row["mean"], rel=0.02), row
        if mine["count"] == row["count"] - (row["min"] < 1e-9):
            assert mine["max"] == pytest.approx(row["max"], rel=1e-6), row


def _event(name, cat, ts, dur, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}


def _hand_trace(path: Path) -> Path:
    """Three profiler steps (the last is dropped, as HTA drops it), times in microseconds:
    step 1 runs a GEMM (20-60) and an all-reduce (50-80): 30 us of communication, 20 exposed;
    step 2 runs two all-reduces (120-130, 125-140) while a GEMM launched in step 1 runs 130-135:
    20 us of communication, 15 exposed."""
    events = [_event(f"ProfilerStep#{k}", "user_annotation", 100 * (k - 1), 100) for k in (1, 2, 3)]
    for corr, call_ts, name, stream, ts, dur in [
            (1, 10, "gemm_kernel", 7, 20, 40), (2, 12, "ncclDevKernel_AllReduce_Sum", 20, 50, 30),
            (5, 90, "gemm_kernel", 7, 130, 5),
            (3, 110, "ncclDevKernel_AllReduce_Sum", 20, 120, 10), (4, 111, "ncclDevKernel_AllReduce_Sum", 20, 125, 15),
            (6, 210, "ncclDevKernel_AllReduce_Sum", 20, 220, 10)]:
        events.append(_event("cudaLaunchKernel", "cuda_runtime", call_ts, 2, correlation=corr))
        events.append(_event(name, "kernel", ts, dur, stream=stream, correlation=corr))
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}))
    return path


def test_each_step_gets_its_nccl_time_and_the_part_no_compute_kernel_hides(tmp_path):
    tables = analyze_trace_files([_hand_trace(tmp_path / "rank0.json")]).tables
    steps = [(r["step"], r["communication_ns"], r["exposed_communication_ns"]) for r in tables["gpu_step_communication"]]
    assert steps == [(1, 30 * US, 20 * US), (2, 20 * US, 15 * US)]


def test_stream_analyses_on_a_hand_worked_trace(tmp_path):
    tables = analyze_trace_files([_hand_trace(tmp_path / "rank0.json")]).tables
    idle = {(r["stream"], r["idle_category"]): (r["idle_time"], r["gaps"]) for r in tables["gpu_idle_time"]}
    # stream 20: 120 was launched (110) after 80 ended: host wait 40; 125 overlaps 130: kernel wait -5
    # stream 7: 130 was launched (90) after 60 ended: host wait 70
    assert idle == {(7, "host_wait"): (70 * US, 1), (7, "other"): (0, 0),
                    (20, "host_wait"): (40 * US, 1), (20, "kernel_wait"): (-5 * US, 1), (20, "other"): (0, 0)}
    queue = {r["stream"]: (r["count"], r["mean"], r["max"]) for r in tables["gpu_queue_length"]}
    assert queue[7] == (4, 0.5, 1)
    summary = tables["gpu_launch_summary"][0]
    assert summary["launches"] == 5 and summary["long_launch_delays"] == 0


def test_covered_length_agrees_with_a_brute_force_count():
    rng = np.random.default_rng(7)
    starts = rng.integers(0, 1000, 200)
    union = merged_intervals(starts, starts + rng.integers(0, 30, 200))
    covered = np.zeros(1100, dtype=bool)
    for s, e in zip(*union):
        covered[s:e] = True
    probe_starts = rng.integers(0, 1000, 300)
    probe_ends = probe_starts + rng.integers(0, 80, 300)
    expected = [covered[s:e].sum() for s, e in zip(probe_starts, probe_ends)]
    assert covered_ns(union, probe_starts, probe_ends).tolist() == expected


def test_a_gpu_run_feeds_its_step_breakdown_and_report_with_the_gpu_figures(tmp_path):
    """The pipeline's order (clocks, GPU analyses, then steps) gives each step of a GPU run its NCCL
    time, and the report shows the GPU sections; the generated set has NCCL all-reduces every step."""
    from rankstream.flows.merge_traces import RUN_ID, scratch_run
    from rankstream.flows.pipeline import ANALYSES
    from rankstream.flows.report import gather_report
    import kineto_gpu_generator

    kineto_gpu_generator.generate(tmp_path, ranks=2, steps=4, kernels_per_step=60, seed=3, compress=False)
    with scratch_run(sorted(tmp_path.glob("rank*.json"))) as (database, _):
        for name in ("clocks", "gpu_breakdown", "steps"):
            ANALYSES[name](database, RUN_ID)
        per_step = database.fetchall("SELECT rank, step, communication_ns, exposed_communication_ns "
                                     "FROM gpu_step_communication ORDER BY ALL")
        in_step_trace = database.fetchall("SELECT rank, step, gpu_communication_ns, gpu_exposed_communication_ns "
                                          "FROM step_trace WHERE gpu_communication_ns IS NOT NULL ORDER BY ALL")
        report = gather_report(database, RUN_ID)
    assert len(per_step) == 2 * 3  # the last of the 4 steps is dropped, as HTA drops it
    assert all(0 <= exposed <= comm and comm > 0 for _, _, comm, exposed in per_step)
    assert in_step_trace == per_step
    assert [row["rank"] for row in report["gpu_breakdown"]] == [0, 1]
    assert {row["stream"] for row in report["gpu_streams"]} == {7, 20, 24}
    assert all(row["launches"] > 0 for row in report["gpu_launches"])


def test_one_file_without_a_rank_is_rank_0_and_says_so_two_are_refused(tmp_path):
    events = json.loads(_hand_trace(tmp_path / "rank0.json").read_text())["traceEvents"]
    for index, name in enumerate(["worker_a.json", "worker_b.json"]):
        (tmp_path / name).write_text(json.dumps([dict(e, pid=100_000 + index) for e in events]))
    analysis = analyze_trace_files([tmp_path / "worker_a.json"])
    assert "taken as rank 0" in analysis.note
    assert {row["rank"] for row in analysis.tables["gpu_temporal_breakdown"]} == {0}
    with pytest.raises(BadInput, match="cannot tell the rank"):
        analyze_trace_files([tmp_path / "worker_a.json", tmp_path / "worker_b.json"])
