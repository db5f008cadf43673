"""The analyses' result tables, declared once (see ``schemas.columns``).

Each analysis replaces one run's rows in one transaction, so these tables hold many runs and a run
can be analyzed again while its data keeps arriving. A rebuild of the projections leaves them: the
analyses recompute them.
"""

from __future__ import annotations

from rankstream.schemas.columns import Column as C
from rankstream.schemas.columns import Table

__all__ = ["ANALYSIS_TABLES", "FINDINGS", "LIVE_FINDINGS"]

_RUN, _RANK = C("run_id", "VARCHAR", not_null=True), C("rank", "INTEGER", not_null=True)

FINDINGS = Table("findings", "The collective diagnosis of a run (rankstream analyze collectives / diagnose).", (
    _RUN,
    C("position", "INTEGER", "reporting order: the root cause first", not_null=True),
    C("kind", "VARCHAR", "skipped_collective, type_mismatch, stuck_in_collective, ...", not_null=True),
    C("pg_name", "VARCHAR"), C("pg_desc", "VARCHAR"),
    C("seq", "BIGINT", "collective_seq_id (p2p_seq_id for p2p findings)"),
    C("culprit_ranks", "INTEGER[]"),
    C("waiting_ranks", "INTEGER[]", "ranks blocked because of it"),
    C("expected", "VARCHAR", "JSON"), C("actual", "VARCHAR", "JSON"),
    C("detail", "VARCHAR", "the finding in one line"),
    C("evidence", "VARCHAR", "JSON list: what decided the culprit"),
    C("explains", "VARCHAR", "JSON list: the findings this one explains"),
    C("stack", "VARCHAR", "JSON: the culprit's Python stack at that entry, innermost first"),
    C("in_flight", "BOOLEAN", "the collective never completed (the hang point)"),
))

LIVE_FINDINGS = Table("live_findings", "Episodes the live hang watch found while runs were running: one row per "
                      "finding, from when it was first seen to when it cleared. Never deleted: a stall that "
                      "cleared stays on record.", (
    _RUN,
    C("kind", "VARCHAR", not_null=True),
    C("culprit_ranks", "INTEGER[]"),
    C("pg_name", "VARCHAR"), C("pg_desc", "VARCHAR"),
    C("seq", "BIGINT", "the collective (or p2p op) at fault"),
    C("first_seen_ns", "BIGINT", not_null=True),
    C("last_seen_ns", "BIGINT", not_null=True),
    C("cleared_ns", "BIGINT", "when it was no longer found (NULL: still going on)"),
    C("waiting_ranks", "INTEGER[]"),
    C("detail", "VARCHAR", "the finding in one line"),
    C("evidence", "VARCHAR", "JSON list"),
    C("stack", "VARCHAR", "JSON: the culprit's stack (Flight Recorder, or the stack its rank published)"),
), obsolete=("detected_ns",))  # the earlier shape held only the current findings

CLOCK_OFFSETS = Table("clock_offsets", "Per-rank clock offsets: the rank's clock minus the reference rank's, from "
                      "every source that had data; the one used for alignment has chosen = true.", (
    _RUN, _RANK,
    C("reference_rank", "INTEGER", not_null=True),
    C("source", "VARCHAR", "barrier, flight_recorder, profiler_steps, none", not_null=True),
    C("offset_ns", "BIGINT"), C("error_ns", "BIGINT", "the true offset lies within offset_ns +- error_ns"),
    C("samples", "BIGINT"), C("chosen", "BOOLEAN", not_null=True), C("detail", "VARCHAR"),
))

STEP_TRACE = Table("step_trace", "One row per (run, rank, step), like MindSpore's step_trace_time: the step's span "
                   "and its phases (each the union of its intervals inside the step).", (
    _RUN, _RANK,
    C("step", "BIGINT", not_null=True),
    C("start_ns", "BIGINT", "aligned clock", not_null=True), C("end_ns", "BIGINT", not_null=True),
    C("duration_ns", "BIGINT", not_null=True),
    C("data_ns", "BIGINT"), C("forward_ns", "BIGINT"), C("backward_ns", "BIGINT"), C("optimizer_ns", "BIGINT"),
    C("communication_ns", "BIGINT"),
    C("other_ns", "BIGINT", "in no phase: Python overhead, sleeps, unannotated work"),
    C("busy_ns", "BIGINT", "duration minus communication: what peers may wait for"),
    C("iteration_interval_ns", "BIGINT", "step start to first forward"),
    C("fp_bp_ns", "BIGINT", "first forward start to last backward end"),
    C("tail_ns", "BIGINT", "last backward end to step end"),
    C("slowest_order", "INTEGER", "1 = the rank with the most busy time in this step"),
    C("gpu_communication_ns", "BIGINT", "GPU runs: the union of the NCCL kernels launched in the step"),
    C("gpu_exposed_communication_ns", "BIGINT", "GPU runs: the part of it no compute kernel hides"),
))

RANK_SLOWNESS = Table("rank_slowness", "Per (run, rank): how often and by how much the rank is the slowest.", (
    _RUN, _RANK,
    C("steps", "BIGINT"), C("mean_step_ns", "DOUBLE"), C("mean_busy_ns", "DOUBLE"),
    C("busy_vs_median", "DOUBLE", "mean busy time / the median rank's mean busy time"),
    C("times_slowest", "BIGINT"), C("ranking", "INTEGER", "1 = slowest overall"),
))

COMM_SUMMARY = Table("comm_summary", "Per (run, group, op) from the Flight Recorder entries: counts, times, sizes and "
                     "bandwidth; wait is the time before the last peer arrived, transfer the rest.", (
    _RUN,
    C("pg_name", "VARCHAR"), C("pg_desc", "VARCHAR"), C("op", "VARCHAR", not_null=True),
    C("calls", "BIGINT", "distinct collectives (p2p: operations)"), C("rank_entries", "BIGINT"),
    C("total_ns", "BIGINT", "summed over ranks"), C("mean_ns", "DOUBLE"),
    C("total_bytes", "BIGINT", "summed over ranks"), C("mean_bytes", "DOUBLE"),
    C("bandwidth_gb_s", "DOUBLE", "mean bytes / mean time per rank entry (algorithm bandwidth)"),
    C("wait_ns", "BIGINT"), C("transfer_ns", "BIGINT"),
    C("time_source", "VARCHAR", "flight_recorder, profiler (gloo spans scaled to all calls) or NULL"),
))

COMM_MATRIX = Table("comm_matrix", "rank x rank traffic, like MindSpore's communication matrix.", (
    _RUN,
    C("kind", "VARCHAR", "p2p (each send from src to dst) or collective (bytes split over the other members)",
      not_null=True),
    C("src_rank", "INTEGER", not_null=True), C("dst_rank", "INTEGER", not_null=True),
    C("ops", "BIGINT"), C("bytes", "DOUBLE"), C("time_ns", "DOUBLE"), C("bandwidth_gb_s", "DOUBLE"),
))

CPU_TEMPORAL_BREAKDOWN = Table("cpu_temporal_breakdown", "Per (run, rank) of runs without GPU events: CPU ops' compute, "
                               "communication, both at once, and idle, over the rank's traced span.", (
    _RUN, _RANK,
    C("span_ns", "BIGINT", "the rank's first traced event to its last"),
    C("cpu_compute_ns", "BIGINT", "the union of CPU ops that are not communication"),
    C("cpu_communication_ns", "BIGINT", "the union of communication ops (gloo collectives, waits)"),
    C("cpu_overlap_ns", "BIGINT", "computing while communicating"), C("cpu_idle_ns", "BIGINT", "in no op"),
    C("cpu_compute_pct", "DOUBLE"), C("cpu_communication_pct", "DOUBLE"), C("cpu_idle_pct", "DOUBLE"),
    C("cpu_overlap_pct_of_comm", "DOUBLE"),
))

OP_STATS = Table("op_stats", "Per (run, op name): time per rank and its spread across ranks.", (
    _RUN,
    C("name", "VARCHAR", not_null=True), C("ranks", "BIGINT"), C("calls", "BIGINT"),
    C("total_ns", "BIGINT", "all ranks"), C("mean_rank_ns", "DOUBLE", "per rank"),
    C("min_rank_ns", "BIGINT"), C("max_rank_ns", "BIGINT"), C("max_rank", "INTEGER"),
    C("spread", "DOUBLE", "(max - min) / mean over ranks"), C("position", "INTEGER", "1 = most total time"),
))

GPU_TEMPORAL_BREAKDOWN = Table(
    "gpu_temporal_breakdown", "Per (run, rank) with GPU events: HTA's temporal breakdown (docs/design.md, GPU analyses).", (
        _RUN, _RANK,
        C("kernel_time", "BIGINT", "ns from the first GPU event's start to the last one's end (HTA's name)"),
        C("idle_time", "BIGINT", "kernel_time minus the union of all GPU events"),
        C("compute_time", "BIGINT", "the union of COMPUTATION kernels"),
        C("non_compute_time", "BIGINT", "the union of all GPU events minus compute_time"),
        C("idle_time_pctg", "DOUBLE", "0-100, of kernel_time"), C("compute_time_pctg", "DOUBLE"),
        C("non_compute_time_pctg", "DOUBLE"),
    ))

COMM_COMP_OVERLAP = Table("comm_comp_overlap", "Per (run, rank) with GPU events: communication hidden by compute.", (
    _RUN, _RANK,
    C("comp_comm_overlap_pctg", "DOUBLE", "100 x |COMMUNICATION ∩ COMPUTATION| / |COMMUNICATION|; NULL without "
      "communication"),
))

GPU_KERNEL_BREAKDOWN = Table("gpu_kernel_breakdown", "Per (run, rank, kernel type, kernel name): its GPU time.", (
    _RUN, _RANK,
    C("kernel_type", "VARCHAR", "COMPUTATION, COMMUNICATION or MEMORY (OTHER kernels are left out, as HTA does)"),
    C("name", "VARCHAR"), C("count", "BIGINT"), C("sum_ns", "BIGINT"), C("mean_ns", "DOUBLE"),
    C("min_ns", "BIGINT"), C("max_ns", "BIGINT"), C("std_ns", "DOUBLE", "sample standard deviation; 0 for one call"),
    C("pct", "DOUBLE", "0-100, of the kernel type's time on the rank"),
))

GPU_KERNEL_TYPE_SHARE = Table("gpu_kernel_type_share", "Per (run, label): GPU time by the kernel types active at "
                              "once, all ranks pooled (\"COMPUTATION overlapping COMMUNICATION\", ...).", (
    _RUN,
    C("kernel_type", "VARCHAR", "the types active, joined by ' overlapping '; labels exclude each other"),
    C("sum_ns", "BIGINT"), C("pct", "DOUBLE", "0-100, of the time any type is active"),
))

GPU_STEP_COMMUNICATION = Table(
    "gpu_step_communication", "Per (run, rank, step) with NCCL kernels: communication time on the GPU and the part "
    "of it no compute kernel hides (kernels belong to the step whose span holds their launch call).", (
        _RUN, _RANK, C("step", "BIGINT", not_null=True),
        C("communication_ns", "BIGINT", "the union of the step's COMMUNICATION kernels"),
        C("exposed_communication_ns", "BIGINT", "communication_ns minus its overlap with any COMPUTATION kernel"),
        C("exposed_pct", "DOUBLE", "0-100, of communication_ns"),
    ))

GPU_IDLE_TIME = Table("gpu_idle_time", "Per (run, rank, stream, category): HTA's idle-time breakdown of the gaps "
                      "between consecutive kernel, memcpy and memset events of a stream.", (
    _RUN, _RANK, C("stream", "BIGINT", not_null=True),
    C("idle_category", "VARCHAR", "host_wait (the launch call started after the previous event ended), kernel_wait "
      "(otherwise, gap under 30 us), other", not_null=True),
    C("idle_time", "BIGINT", "ns, summed gaps (negative gaps of overlapping events count, as in HTA)"),
    C("idle_time_ratio", "DOUBLE", "0-1, of the stream's idle time"), C("gaps", "BIGINT"),
))

_SUMMARY = (C("count", "BIGINT", "points of the series"), C("mean", "DOUBLE"), C("std", "DOUBLE", "sample"),
            C("min", "DOUBLE"), C("p25", "DOUBLE"), C("p50", "DOUBLE"), C("p75", "DOUBLE"), C("max", "DOUBLE"))

GPU_QUEUE_LENGTH = Table("gpu_queue_length", "Per (run, rank, stream): HTA's queue length summary, the launches "
                         "waiting on the stream (+1 at the launch call, -1 when its GPU event starts), over the "
                         "series' change points.", (_RUN, _RANK, C("stream", "BIGINT", not_null=True), *_SUMMARY))

GPU_KERNEL_LAUNCHES = Table("gpu_kernel_launches", "One row per (launch call, GPU event) pair: HTA's kernel launch "
                            "stats, with its plot cutoffs as flags.", (
    _RUN, _RANK, C("correlation", "BIGINT"), C("launch_call", "VARCHAR", "cudaLaunchKernel, cudaMemcpyAsync, ..."),
    C("name", "VARCHAR", "the GPU event"), C("stream", "BIGINT"),
    C("cpu_duration", "BIGINT", "ns, the launch call"), C("gpu_duration", "BIGINT", "ns, the GPU event"),
    C("launch_delay", "BIGINT", "ns, GPU start - launch call end, at least 0"),
    C("long_launch_call", "BOOLEAN", "cpu_duration > 50 us"), C("long_launch_delay", "BOOLEAN", "launch_delay > 100 us"),
    C("short_kernel", "BOOLEAN", "cpu_duration <= 50 us and the GPU event is shorter than its launch call"),
))

GPU_LAUNCH_SUMMARY = Table("gpu_launch_summary", "Per (run, rank): gpu_kernel_launches summed up.", (
    _RUN, _RANK, C("launches", "BIGINT"), C("long_launch_calls", "BIGINT"), C("long_launch_delays", "BIGINT"),
    C("short_kernels", "BIGINT"), C("cpu_duration_p50", "DOUBLE", "ns"), C("cpu_duration_max", "BIGINT"),
    C("launch_delay_p50", "DOUBLE", "ns"), C("launch_delay_p99", "DOUBLE"), C("launch_delay_max", "BIGINT"),
))

GPU_MEMORY_BANDWIDTH = Table("gpu_memory_bandwidth", "Per (run, rank, memory kind): HTA's memory bandwidth summary "
                             "in GB/s, from the trace's own \"memory bandwidth (GB/s)\" argument: the bandwidth of "
                             "the events running at once, at each change point where it is above zero.", (
    _RUN, _RANK, C("name", "VARCHAR", "Memcpy HtoD, Memcpy DtoH, Memcpy DtoD, Memset, ...", not_null=True),
    *_SUMMARY))

ANALYSES_DONE = Table("analyses_done", "Which analyses ran for which run (the end-of-run trigger runs each once).", (
    _RUN,
    C("analysis", "VARCHAR", not_null=True), C("finished_ns", "BIGINT", not_null=True), C("detail", "VARCHAR"),
))

ANALYSIS_TABLES = (FINDINGS, LIVE_FINDINGS, CLOCK_OFFSETS, STEP_TRACE, RANK_SLOWNESS, COMM_SUMMARY, COMM_MATRIX,
                   CPU_TEMPORAL_BREAKDOWN, OP_STATS, GPU_TEMPORAL_BREAKDOWN, COMM_COMP_OVERLAP, GPU_KERNEL_BREAKDOWN,
                   GPU_KERNEL_TYPE_SHARE, GPU_STEP_COMMUNICATION, GPU_IDLE_TIME, GPU_QUEUE_LENGTH, GPU_KERNEL_LAUNCHES,
                   GPU_LAUNCH_SUMMARY, GPU_MEMORY_BANDWIDTH, ANALYSES_DONE)
