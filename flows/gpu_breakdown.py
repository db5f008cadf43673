"""Where the GPUs' time goes, by Holistic Trace Analysis's rules, so figures compare column by column.

``analyze_gpu_breakdown`` fills, for a run with GPU events (``run_gpu_events``: events with a
stream, the last profiler step dropped as HTA drops it; the rules are in docs/design.md):

* ``gpu_temporal_breakdown``: per rank, all streams pooled: the span from the first GPU event to
  the last (``kernel_time``), the idle part of it, the compute part (the union of COMPUTATION
  kernels) and the rest;
* ``comm_comp_overlap``: per rank, the share of communication time that compute hides;
* ``gpu_kernel_breakdown``: per rank, kernel type and kernel name: count and time statistics. Unlike
  HTA, which folds all but the top kernels into ``others`` and then loses their per-call figures,
  every kernel keeps its own row;
* ``gpu_kernel_type_share``: all ranks pooled, the time during which each combination of kernel
  types runs ("COMPUTATION overlapping COMMUNICATION", ...).

and, through ``flows.gpu_streams``, the per-stream analyses (idle time, queue length, launches,
memory bandwidth) and the communication each step leaves exposed.

A run without GPU events (gloo, CPU) gets no rows here; its CPU figures are in
``cpu_temporal_breakdown``. Unions count touching intervals as one, as HTA does; they are computed in
numpy next to the data (a query-server procedure), like ``breakdown.union_lengths``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rankstream.consumers.query_server import register_procedure
from rankstream.flows.gpu_streams import GPU_STREAM_STATEMENTS, GPU_STREAM_TABLES
from rankstream.flows.intervals import merged_intervals
from rankstream.consumers.query import connect
from rankstream.flows.run_tables import ensure_schema, replace_run_rows

__all__ = ["analyze_gpu_breakdown", "gpu_unions", "steps_note", "GPU_TABLES"]

GPU_TABLES = ["gpu_temporal_breakdown", "comm_comp_overlap", "gpu_kernel_breakdown", "gpu_kernel_type_share",
              *GPU_STREAM_TABLES]

#: Kernel types in the order HTA names their combinations, with their bits in the sweep.
TYPES = ("COMPUTATION", "COMMUNICATION", "MEMORY")


def _length(starts: np.ndarray, ends: np.ndarray) -> int:
    return int((ends - starts).sum())


def _rank_figures(types: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[list, float | None, dict]:
    """One rank's temporal row, overlap percentage and time per type combination."""
    busy = merged_intervals(starts, ends)
    unions = {t: merged_intervals(starts[types == t], ends[types == t]) for t in TYPES}
    kernel_time = int(ends.max() - starts.min())
    busy_ns, compute_ns = _length(*busy), _length(*unions["COMPUTATION"])
    temporal = [kernel_time, kernel_time - busy_ns, compute_ns, busy_ns - compute_ns]
    comm_ns = _length(*unions["COMMUNICATION"])
    both = merged_intervals(np.r_[unions["COMMUNICATION"][0], unions["COMPUTATION"][0]],
                            np.r_[unions["COMMUNICATION"][1], unions["COMPUTATION"][1]])
    overlap = 100.0 * (comm_ns + compute_ns - _length(*both)) / comm_ns if comm_ns else None
    return temporal, overlap, _type_combinations(unions)


def _type_combinations(unions: dict) -> dict[str, int]:
    """Sweep over the types' unions: time per set of types active at once."""
    times, deltas = [], []
    for bit, kind in enumerate(TYPES):
        group_starts, group_ends = unions[kind]
        times += [group_starts, group_ends]
        deltas += [np.full(len(group_starts), 1 << bit), np.full(len(group_ends), -(1 << bit))]
    times, deltas = np.concatenate(times), np.concatenate(deltas)
    if not len(times):
        return {}
    order = np.argsort(times, kind="stable")
    times, active = times[order], np.cumsum(deltas[order])
    lengths = np.diff(times)
    out: dict[str, int] = {}
    for mask in np.unique(active[:-1]):
        if mask > 0:
            label = " overlapping ".join(kind for bit, kind in enumerate(TYPES) if mask & (1 << bit))
            out[label] = int(lengths[active[:-1] == mask].sum())
    return out


def gpu_unions(con, params: dict) -> None:
    """Create ``_gpu_temporal``, ``_gpu_overlap`` and ``_gpu_type_share`` on ``con`` from
    ``_hta_events`` (see the module docstring); registered below as a query-server procedure."""
    events = con.sql("SELECT rank, kernel_type, start_ns, end_ns FROM _hta_events WHERE is_gpu").fetchnumpy()
    ranks, types = np.asarray(events["rank"]), np.asarray(events["kernel_type"], dtype=object)
    starts, ends = np.asarray(events["start_ns"]), np.asarray(events["end_ns"])
    temporal, overlap, shares = [], [], {}
    for rank in np.unique(ranks).tolist():
        rows = ranks == rank
        figures, ratio, combinations = _rank_figures(types[rows], starts[rows], ends[rows])
        temporal.append([rank, *figures])
        overlap.append((rank, ratio))
        for label, ns in combinations.items():
            shares[label] = shares.get(label, 0) + ns
    columns = list(zip(*temporal)) or [[]] * 5
    con.execute("CREATE OR REPLACE TEMP TABLE _gpu_temporal AS SELECT unnest($1::INTEGER[]) AS rank, "
                "unnest($2::BIGINT[]) AS kernel_time, unnest($3::BIGINT[]) AS idle_time, "
                "unnest($4::BIGINT[]) AS compute_time, unnest($5::BIGINT[]) AS non_compute_time",
                [list(c) for c in columns])
    con.execute("CREATE OR REPLACE TEMP TABLE _gpu_overlap AS SELECT unnest($1::INTEGER[]) AS rank, "
                "unnest($2::DOUBLE[]) AS pctg", [[r for r, _ in overlap], [v for _, v in overlap]])
    con.execute("CREATE OR REPLACE TEMP TABLE _gpu_type_share AS SELECT unnest($1::VARCHAR[]) AS kernel_type, "
                "unnest($2::BIGINT[]) AS sum_ns", [list(shares), list(shares.values())])


register_procedure("gpu_unions", gpu_unions)

#: The run's events as HTA loads them, read once by every statement after it (and by ``flows.gpu_streams``).
HTA_EVENTS_SQL = "CREATE OR REPLACE TEMP TABLE _hta_events AS SELECT * FROM run_hta_events($run, $keep_last)"

GPU_TEMPORAL_SQL = """
INSERT INTO gpu_temporal_breakdown
SELECT $run, rank, kernel_time, idle_time, compute_time, non_compute_time,
       100.0 * idle_time / nullif(kernel_time, 0), 100.0 * compute_time / nullif(kernel_time, 0),
       100.0 * non_compute_time / nullif(kernel_time, 0)
FROM _gpu_temporal
"""

GPU_OVERLAP_SQL = "INSERT INTO comm_comp_overlap SELECT $run, rank, pctg FROM _gpu_overlap"

GPU_TYPE_SHARE_SQL = """
INSERT INTO gpu_kernel_type_share
SELECT $run, kernel_type, sum_ns, 100.0 * sum_ns / nullif(sum(sum_ns) OVER (), 0) FROM _gpu_type_share
"""

GPU_KERNELS_SQL = """
INSERT INTO gpu_kernel_breakdown
WITH per_kernel AS (
    SELECT rank, kernel_type, name, count(*) AS calls, sum(end_ns - start_ns) AS sum_ns,
           avg(end_ns - start_ns) AS mean_ns, min(end_ns - start_ns) AS min_ns, max(end_ns - start_ns) AS max_ns,
           coalesce(stddev_samp(end_ns - start_ns), 0) AS std_ns
    FROM _hta_events WHERE is_gpu AND kernel_type <> 'OTHER' GROUP BY ALL
)
SELECT $run, rank, kernel_type, name, calls, sum_ns, mean_ns, min_ns, max_ns, std_ns,
       100.0 * sum_ns / nullif(sum(sum_ns) OVER (PARTITION BY rank, kernel_type), 0)
FROM per_kernel
"""


def steps_note(db_path: Path, run_id: str) -> str | None:
    """Which ranks the last-step rule leaves whole, or None: ranks without a ProfilerStep of their own
    in a run whose other ranks have them (``run_ranks_without_steps``). HTA fails on such a run; here
    all their events count, which changes their figures, so the analysis must say so."""
    ensure_schema(db_path)
    ranks = [rank for (rank,) in connect(db_path).fetchall("SELECT rank FROM run_ranks_without_steps($1)", [run_id])]
    if not ranks:
        return None
    who = "rank " + str(ranks[0]) if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    return (f"{who}: no ProfilerStep markers while other ranks have them, so no last step is dropped "
            "there: every event counts")


def analyze_gpu_breakdown(db_path: Path, run_id: str, *, keep_last_step: bool = False) -> str | None:
    """(Re)build the GPU tables for a run (no rows when it has no GPU events). Returns
    ``steps_note``, which also goes into the analysis's detail in ``analyses_done``."""
    note = steps_note(db_path, run_id)
    replace_run_rows(db_path, run_id, "gpu_breakdown", tables=GPU_TABLES, keep_last=keep_last_step,
                     detail=note,
                     statements=[HTA_EVENTS_SQL, "procedure:gpu_unions", GPU_TEMPORAL_SQL, GPU_OVERLAP_SQL,
                                 GPU_TYPE_SHARE_SQL, GPU_KERNELS_SQL, *GPU_STREAM_STATEMENTS])
    return note
