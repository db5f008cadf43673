"""The HTML report's charts: each one a plotly figure (a plain dict) built from a few aggregate
queries over the run's tables, so the page never carries raw events.

Big runs are binned, never sampled: steps into at most ``MAX_BINS`` columns, collective sequence
numbers likewise, ranks of the communication matrix into at most ``MAX_MATRIX`` rows. A binned
cell shows the bin's *maximum* (its median rides along in the hover text), so one stalled step
among ten thousand still lights up its cell. Every builder returns ``None`` when the run has no
data for it; the page then says so in words.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from rankstream.flows.collective_analysis import live_episodes

__all__ = ["Chart", "MAX_BINS", "step_charts", "collective_charts", "breakdown_chart", "matrix_chart",
           "top_chart", "clock_chart", "ingest_chart", "worst_steps", "verdict"]

#: Columns of a binned heatmap (steps or collective sequence numbers).
MAX_BINS = 200
#: Rows and columns of the communication matrix; more ranks are grouped into equal rank ranges.
MAX_MATRIX = 256
#: Collective-progress heatmaps drawn; the groups named by a finding come first, then the largest.
MAX_GROUPS = 4
#: Finding and episode rows shown in the verdict section.
MAX_FINDINGS = 12

_FONT = {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12}


@dataclass
class Chart:
    """One plot: its id on the page, a title, the plotly figure and a line that reads it."""

    id: str
    title: str
    figure: dict
    caption: str = ""
    #: The figure's height in pixels (heatmaps grow with the number of ranks, up to a limit).
    height: int = 360
    extra: dict = field(default_factory=dict)


def _layout(xtitle: str, ytitle: str, height: int, **more) -> dict:
    return {"height": height, "margin": {"l": 70, "r": 20, "t": 10, "b": 50}, "font": _FONT,
            "xaxis": {"title": {"text": xtitle}}, "yaxis": {"title": {"text": ytitle}}, **more}


def _rank_axis(ranks: int, title: str = "rank", **more) -> dict:
    """Whole ranks only: one tick per rank while they fit, integer ticks after."""
    return {"title": {"text": title}, "tickformat": "d", **({"dtick": 1} if ranks <= 32 else {}), **more}


def _rows_height(rows: int) -> int:
    return int(min(900, max(260, 60 + 4 * rows)))


def _ms(values) -> list:
    """Nanoseconds to milliseconds, rounded to 0.01 ms (the page's size grows with every digit)."""
    return np.round(np.asarray(values, dtype=np.float64) / 1e6, 2).tolist()


# -- verdict -------------------------------------------------------------------------------------

def verdict(database, run_id: str) -> dict:
    """The collective diagnosis as stored: verdict, root cause, findings and live episodes."""
    done = database.fetchall("SELECT arg_max(detail, finished_ns) FROM analyses_done "
                             "WHERE run_id = $1 AND analysis = 'collectives'", [run_id])
    findings = database.arrow(
        "SELECT kind, pg_name, pg_desc, seq, culprit_ranks, waiting_ranks, detail, stack FROM findings "
        "WHERE run_id = $1 ORDER BY position LIMIT $2", [run_id, MAX_FINDINGS]).to_pylist()
    episodes = live_episodes(database, run_id)[:MAX_FINDINGS]
    for row in findings + episodes:
        row["stack"] = _stack_lines(row.get("stack"))
    return {"verdict": done[0][0] if done and done[0][0] else None, "findings": findings, "episodes": episodes}


def _stack_lines(stack) -> list[str]:
    if not stack:
        return []
    try:
        frames = json.loads(stack) if isinstance(stack, str) else stack
    except ValueError:
        return [str(stack)]
    if isinstance(frames, dict):
        frames = [f"rank {rank}: {' <- '.join(map(_frame, lines))}" for rank, lines in frames.items()]
    return [_frame(frame) for frame in frames][:8] if isinstance(frames, list) else [str(frames)]


def _frame(frame) -> str:
    """``name (file:line)`` for torch's frame dicts, the text itself otherwise."""
    if isinstance(frame, dict) and "name" in frame:
        return f"{frame['name']} ({frame.get('filename', '?')}:{frame.get('line', '?')})"
    return str(frame)


# -- steps ---------------------------------------------------------------------------------------

_STEP_DISTRIBUTION_SQL = """
SELECT rank, count(*) AS steps,
       quantile_cont(duration_ns, [0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0]) AS q
FROM step_trace WHERE run_id = $1 GROUP BY rank ORDER BY rank
"""

_STEP_BINS_SQL = """
WITH s AS (SELECT rank, step, duration_ns FROM step_trace WHERE run_id = $1),
     span AS (SELECT min(step) AS lo, max(step) - min(step) + 1 AS width FROM s)
SELECT rank, (step - lo) * $2 // width AS bin, max(duration_ns) AS worst, median(duration_ns) AS median,
       arg_max(step, duration_ns) AS worst_step, min(step) AS first_step, max(step) AS last_step
FROM s, span GROUP BY ALL
"""


def step_charts(database, run_id: str) -> list[Chart]:
    """Step time per rank: its distribution (a box, log scale) and a step x rank heatmap."""
    per_rank = database.arrow(_STEP_DISTRIBUTION_SQL, [run_id])
    if not per_rank.num_rows:
        return []
    ranks = per_rank["rank"].to_numpy()
    q = np.array(per_rank["q"].to_pylist(), dtype=np.float64) / 1e6
    box = {"type": "box", "name": "step time", "x": ranks.tolist(), "lowerfence": np.round(q[:, 0], 2).tolist(),
           "q1": np.round(q[:, 1], 2).tolist(), "median": np.round(q[:, 2], 2).tolist(),
           "q3": np.round(q[:, 3], 2).tolist(), "upperfence": np.round(q[:, 6], 2).tolist(),
           "marker": {"color": "#4c78a8"}, "hoverinfo": "x+y"}
    p99 = {"type": "scatter", "mode": "markers", "name": "p99", "x": ranks.tolist(),
           "y": np.round(q[:, 5], 2).tolist(), "marker": {"symbol": "line-ew-open", "size": 10, "color": "#e45756"}}
    distribution = Chart("steps-distribution", "Step time per rank",
                         {"data": [box, p99], "layout": _layout("rank", "step time (ms, log scale)", 360,
                                                                yaxis={"type": "log", "title": {"text": "ms"}},
                                                                xaxis=_rank_axis(len(ranks)), showlegend=True)},
                         "Box: quartiles, whiskers at the fastest and the slowest step; red tick: p99.")
    steps_total = int(per_rank["steps"].to_numpy().max())
    bins = min(MAX_BINS, steps_total)
    cells = database.arrow(_STEP_BINS_SQL, [run_id, bins])
    row_of = {int(rank): i for i, rank in enumerate(ranks.tolist())}
    rows = np.array([row_of[int(r)] for r in cells["rank"].to_numpy()], dtype=np.int64)
    columns = cells["bin"].to_numpy().astype(np.int64)
    worst = np.full((len(ranks), bins), np.nan)
    median = np.full((len(ranks), bins), np.nan)
    worst[rows, columns] = np.round(cells["worst"].to_numpy() / 1e6, 2)
    median[rows, columns] = np.round(cells["median"].to_numpy() / 1e6, 2)
    lows = cells["first_step"].to_numpy()
    first_step = np.full(bins, np.iinfo(np.int64).max)
    np.minimum.at(first_step, columns, lows)
    labels = [int(s) if s != np.iinfo(np.int64).max else None for s in first_step]
    heat = {"type": "heatmap", "z": worst.tolist(), "customdata": median.tolist(), "x": labels,
            "y": ranks.tolist(), "colorscale": "YlOrRd", "reversescale": True,
            "colorbar": {"title": {"text": "max ms"}},
            "hovertemplate": "rank %{y}, steps from %{x}<br>max %{z} ms, median %{customdata} ms<extra></extra>",
            "xgap": 0, "ygap": 0}
    per_bin = (steps_total + bins - 1) // bins
    return [distribution,
            Chart("steps-heatmap", "Step time by step and rank",
                  {"data": [heat], "layout": _layout("first step of the bin", "rank", _rows_height(len(ranks)),
                                                     xaxis={"type": "category" if bins < 40 else "linear",
                                                            "title": {"text": "step"}},
                                                     yaxis=_rank_axis(len(ranks)))},
                  f"Each cell: the slowest of {per_bin} step(s) of one rank (median in the hover); "
                  "a stalled step stands out however many steps there are.", _rows_height(len(ranks)))]


_WORST_STEPS_SQL = """
WITH worst AS (SELECT rank, step, duration_ns FROM step_trace WHERE run_id = $1 ORDER BY duration_ns DESC LIMIT $2),
     medians AS (SELECT rank, median(duration_ns) AS median_ns FROM step_trace
                 WHERE run_id = $1 AND rank IN (SELECT rank FROM worst) GROUP BY rank)
SELECT rank, step, duration_ns / 1e6 AS step_ms, duration_ns / nullif(median_ns, 0) AS times_median
FROM worst JOIN medians USING (rank) ORDER BY duration_ns DESC, rank, step
"""


def worst_steps(database, run_id: str, count: int = 10) -> list[dict]:
    """The run's slowest steps, each against its rank's median step."""
    return database.arrow(_WORST_STEPS_SQL, [run_id, count]).to_pylist()


# -- collectives ---------------------------------------------------------------------------------

_PROGRESS_SQL = """
WITH latest AS (
    SELECT pg_name, rank, collective_seq_id AS seq, arg_max(state, snapshot_ns) AS state,
           arg_max(profiling_name || ' ' || coalesce(sizes_key::VARCHAR, ''), snapshot_ns) AS call
    FROM fr_entries WHERE run_id = $1 AND NOT is_p2p AND collective_seq_id > 0 AND pg_name IN (SELECT unnest($2))
    GROUP BY ALL),
majority AS (SELECT pg_name, seq, mode(call) AS usual FROM latest GROUP BY ALL),
span AS (SELECT pg_name, min(seq) AS lo, max(seq) - min(seq) + 1 AS width FROM latest GROUP BY pg_name),
binned AS (
    SELECT l.pg_name, rank, l.seq, (l.seq - lo) * least($3, width) // width AS bin, least($3, width) AS bins,
           CASE WHEN call <> usual THEN 4 WHEN state = 'completed' THEN 3 WHEN state = 'started' THEN 2 ELSE 1 END
               AS code
    FROM latest l JOIN span USING (pg_name) JOIN majority m USING (pg_name, seq)),
per_bin AS (SELECT pg_name, bin, count(DISTINCT seq) AS seqs, min(seq) AS first_seq FROM binned GROUP BY ALL)
SELECT b.pg_name, b.rank, b.bin, any_value(b.bins) AS bins, any_value(p.first_seq) AS first_seq,
       CASE WHEN max(b.code) = 4 THEN 4 WHEN count(*) < any_value(p.seqs) THEN 0 ELSE min(b.code) END AS code
FROM binned b JOIN per_bin p USING (pg_name, bin) GROUP BY ALL
"""

_GROUPS_SQL = """
WITH named AS (SELECT DISTINCT pg_name FROM findings WHERE run_id = $1 AND pg_name IS NOT NULL),
     sizes AS (SELECT pg_name, any_value(pg_desc) AS pg_desc, count(DISTINCT rank) AS ranks
               FROM fr_entries WHERE run_id = $1 AND NOT is_p2p AND collective_seq_id > 0 GROUP BY pg_name)
SELECT pg_name, pg_desc, ranks, pg_name IN (SELECT pg_name FROM named) AS named FROM sizes
ORDER BY named DESC, ranks DESC, pg_name
"""

_STATES = ["no entry", "scheduled (gloo records no more)", "started", "completed", "another op or size than its peers"]
_STATE_COLORS = [[0.0, "#d62728"], [0.2, "#d62728"], [0.2, "#c7c7c7"], [0.4, "#c7c7c7"], [0.4, "#ff9f1c"],
                 [0.6, "#ff9f1c"], [0.6, "#2ca02c"], [0.8, "#2ca02c"], [0.8, "#9467bd"], [1.0, "#9467bd"]]


def collective_charts(database, run_id: str) -> tuple[list[Chart], int]:
    """Per process group: ranks against collective sequence number, coloured by how far each rank
    got (a bin shows its least advanced collective; "no entry" where the rank logged fewer of the
    bin's collectives than the others; another op or size than the majority's wins over both), with
    the findings' culprits marked. Also how many groups were left out."""
    groups = database.arrow(_GROUPS_SQL, [run_id]).to_pylist()
    chosen = groups[:MAX_GROUPS]
    if not chosen:
        return [], 0
    cells = database.arrow(_PROGRESS_SQL, [run_id, [g["pg_name"] for g in chosen], MAX_BINS])
    findings = database.arrow("SELECT pg_name, seq, culprit_ranks, kind, detail FROM findings "
                              "WHERE run_id = $1 AND seq IS NOT NULL", [run_id]).to_pylist()
    names = np.array(cells["pg_name"].to_pylist(), dtype=object)
    charts = []
    for group in chosen:
        mine = cells.filter(names == group["pg_name"])
        if mine.num_rows:
            charts.append(_progress_chart(group, mine, [f for f in findings if f["pg_name"] == group["pg_name"]],
                                          len(charts)))
    return charts, max(0, len(groups) - len(chosen))


def _progress_chart(group: dict, cells, findings: list[dict], number: int) -> Chart:
    ranks = sorted(set(cells["rank"].to_pylist()))
    bins = int(cells["bins"][0].as_py())
    row_of = {r: i for i, r in enumerate(ranks)}
    rows = np.array([row_of[r] for r in cells["rank"].to_pylist()], dtype=np.int64)
    columns = cells["bin"].to_numpy().astype(np.int64)
    code = np.zeros((len(ranks), bins))  # a rank with nothing in a bin logged none of it
    code[rows, columns] = cells["code"].to_numpy()
    first_seq = np.zeros(bins, dtype=np.int64)
    first_seq[columns] = cells["first_seq"].to_numpy()
    text = np.array(_STATES, dtype=object)[code.astype(np.int64)]
    heat = {"type": "heatmap", "z": code.tolist(), "x": first_seq.tolist(), "y": ranks, "zmin": 0, "zmax": 4,
            "colorscale": _STATE_COLORS, "text": text.tolist(), "name": "",
            "colorbar": {"tickvals": [0.4, 1.2, 2.0, 2.8, 3.6],
                         "ticktext": ["none", "scheduled", "started", "completed", "differs"]},
            "hovertemplate": "rank %{y}, collective #%{x}: %{text}<extra></extra>"}
    data = [heat]
    marks = [(f, rank) for f in findings for rank in f["culprit_ranks"] or [] if rank in row_of]
    if marks:
        at = np.clip(np.searchsorted(first_seq, [f["seq"] for f, _ in marks], side="right") - 1, 0, bins - 1)
        data.append({"type": "scatter", "mode": "markers", "name": "culprit", "x": first_seq[at].tolist(),
                     "y": [rank for _, rank in marks], "text": [f"{f['kind']}: {f['detail']}" for f, _ in marks],
                     "marker": {"symbol": "x-thin-open", "size": 16, "line": {"width": 3}, "color": "#111"},
                     "hovertemplate": "%{text}<extra>culprit</extra>"})
    described = group["pg_desc"] and group["pg_desc"] != "undefined"
    name = group["pg_name"] + (f" ({group['pg_desc']})" if described else "")
    height = _rows_height(len(ranks))
    layout = _layout("collective sequence number", "rank", height, showlegend=False,
                     xaxis={"type": "category" if bins < 40 else "linear", "title": {"text": "collective #"}},
                     yaxis=_rank_axis(len(ranks)))
    return Chart(f"progress-{number}", f"Collective progress, group {name}", {"data": data, "layout": layout},
                 "Each rank's Flight Recorder entries by sequence number: a rank that stopped, skipped or "
                 "called something else stands out in its row; x marks a finding's culprit.", height)


# -- where the time goes -------------------------------------------------------------------------

def breakdown_chart(database, run_id: str) -> Chart | None:
    """Per rank, stacked: GPU compute / non-compute / idle (HTA's rules) where there are kernels,
    else the CPU's compute / communication / idle; and the share of communication hidden."""
    gpu = database.arrow(
        "SELECT t.rank, t.compute_time_pctg AS a, t.non_compute_time_pctg AS b, t.idle_time_pctg AS c, "
        "o.comp_comm_overlap_pctg AS overlap FROM gpu_temporal_breakdown t LEFT JOIN comm_comp_overlap o "
        "USING (run_id, rank) WHERE t.run_id = $1 ORDER BY t.rank", [run_id])
    if gpu.num_rows:
        table, names, where = gpu, ("compute", "non-compute (communication, memory)", "idle"), "GPU"
    else:
        table = database.arrow(
            "SELECT rank, cpu_compute_pct AS a, cpu_communication_pct AS b, cpu_idle_pct AS c, "
            "cpu_overlap_pct_of_comm AS overlap FROM cpu_temporal_breakdown WHERE run_id = $1 ORDER BY rank", [run_id])
        names, where = ("compute", "communication", "idle"), "CPU"
    if not table.num_rows:
        return None
    ranks = table["rank"].to_pylist()
    colors = ("#4c78a8", "#f58518", "#bab0ac")
    data = [{"type": "bar", "name": name, "x": ranks, "y": np.round(table[column].to_numpy(zero_copy_only=False)
                                                                   .astype(np.float64), 2).tolist(),
             "marker": {"color": color}} for name, column, color in zip(names, ("a", "b", "c"), colors)]
    data.append({"type": "scatter", "mode": "lines+markers", "name": "communication hidden (%)", "x": ranks,
                 "y": [None if v is None else round(v, 2) for v in table["overlap"].to_pylist()], "yaxis": "y2",
                 "marker": {"color": "#54a24b"}})
    layout = _layout("rank", "% of the traced span", 360, barmode="stack", xaxis=_rank_axis(len(ranks)),
                     yaxis2={"overlaying": "y", "side": "right", "range": [0, 100], "showgrid": False,
                             "title": {"text": "hidden %"}}, legend={"orientation": "h", "y": -0.25})
    return Chart("breakdown", f"Where the time goes ({where})", {"data": data, "layout": layout},
                 f"{where} time per rank as a share of its traced span; green: the share of communication "
                 "time that overlaps compute.")


def matrix_chart(database, run_id: str) -> Chart | None:
    """Bytes from each source rank to each destination rank (all kinds), with the bandwidth."""
    world = database.fetchall("SELECT greatest(max(src_rank), max(dst_rank)) + 1 FROM comm_matrix WHERE run_id = $1",
                              [run_id])[0][0]
    if not world:
        return None
    size = min(int(world), MAX_MATRIX)
    cells = database.arrow(
        "SELECT src_rank * $2 // $3 AS src, dst_rank * $2 // $3 AS dst, sum(bytes)::DOUBLE AS bytes, "
        "sum(bytes)::DOUBLE / nullif(sum(time_ns), 0) AS gb_s FROM comm_matrix WHERE run_id = $1 GROUP BY ALL",
        [run_id, size, int(world)])
    src, dst = cells["src"].to_numpy().astype(np.int64), cells["dst"].to_numpy().astype(np.int64)
    z = np.full((size, size), np.nan)
    bandwidth = np.full((size, size), np.nan)
    z[src, dst] = np.round(cells["bytes"].to_numpy(zero_copy_only=False).astype(np.float64) / 1e6, 3)
    bandwidth[src, dst] = np.round(cells["gb_s"].to_numpy(zero_copy_only=False).astype(np.float64), 3)
    first = [int(i * world // size) for i in range(size)]
    heat = {"type": "heatmap", "z": z.tolist(), "customdata": bandwidth.tolist(), "x": first, "y": first,
            "colorscale": "Blues", "reversescale": True, "colorbar": {"title": {"text": "MB"}},
            "hovertemplate": "rank %{y} -> rank %{x}: %{z} MB, %{customdata} GB/s<extra></extra>"}
    grouped = f" (ranks grouped {int(world) // size} to a cell)" if size < world else ""
    return Chart("matrix", "Communication matrix", {"data": [heat], "layout": _layout(
        "destination rank", "source rank", _rows_height(size), xaxis=_rank_axis(size, "destination rank"),
        yaxis=_rank_axis(size, "source rank", autorange="reversed"))},
        f"Bytes sent from each rank to each other rank, all collectives and point-to-point{grouped}.",
        _rows_height(size))


def top_chart(database, run_id: str, count: int = 15) -> Chart | None:
    """The kernels (GPU runs) or ops that take the most time, summed over ranks."""
    rows = database.arrow(
        "SELECT name, kernel_type AS kind, sum(sum_ns)::DOUBLE AS total_ns, sum(count)::BIGINT AS calls "
        "FROM gpu_kernel_breakdown "
        "WHERE run_id = $1 GROUP BY ALL ORDER BY total_ns DESC LIMIT $2", [run_id, count])
    what = "kernels"
    if not rows.num_rows:
        rows = database.arrow("SELECT name, NULL AS kind, total_ns, calls FROM op_stats WHERE run_id = $1 "
                              "ORDER BY total_ns DESC LIMIT $2", [run_id, count])
        what = "ops"
    if not rows.num_rows:
        return None
    names = [n if len(n) <= 60 else n[:57] + "..." for n in rows["name"].to_pylist()][::-1]
    bar = {"type": "bar", "orientation": "h", "x": _ms(rows["total_ns"].to_numpy(zero_copy_only=False))[::-1],
           "y": names, "customdata": rows["calls"].to_pylist()[::-1], "marker": {"color": "#72b7b2"},
           "hovertemplate": "%{y}: %{x} ms in %{customdata} calls<extra></extra>"}
    return Chart("top", f"Top {what}", {"data": [bar], "layout": _layout(
        "total ms (all ranks)", "", max(300, 24 * len(names) + 60), margin={"l": 330, "r": 20, "t": 10, "b": 50})},
        f"The {len(names)} {what} with the most time, summed over ranks.", max(300, 24 * len(names) + 60))


# -- health --------------------------------------------------------------------------------------

def clock_chart(database, run_id: str) -> Chart | None:
    rows = database.arrow("SELECT rank, source, offset_ns / 1e3 AS offset_us, error_ns / 1e3 AS error_us "
                          "FROM clock_offsets WHERE run_id = $1 AND chosen ORDER BY rank", [run_id])
    if not rows.num_rows:
        return None
    points = {"type": "scatter", "mode": "markers", "x": rows["rank"].to_pylist(),
              "y": [round(v, 1) for v in rows["offset_us"].to_pylist()], "text": rows["source"].to_pylist(),
              "error_y": {"type": "data", "array": [None if e is None else round(e, 1)
                                                    for e in rows["error_us"].to_pylist()], "visible": True},
              "hovertemplate": "rank %{x}: %{y} us (%{text})<extra></extra>"}
    return Chart("clock", "Clock alignment", {"data": [points], "layout": _layout(
        "rank", "offset from the reference clock (us)", 300, xaxis=_rank_axis(rows.num_rows))},
        "Each rank's clock offset with its error bound, as the timeline and the diagnosis apply it.", 300)


_INGEST_SQL = """
SELECT rank, arg_max(events_sent, sent_ns) AS sent, arg_max(events_dropped, sent_ns) AS dropped,
       arg_max(events_spooled, sent_ns) AS spooled, bool_or(final) AS ended
FROM heartbeats WHERE run_id = $1 GROUP BY rank ORDER BY rank
"""


def ingest_chart(database, run_id: str) -> tuple[Chart | None, dict]:
    """Events each rank sent, dropped and spooled (its last heartbeat), and the run's totals."""
    rows = database.arrow(_INGEST_SQL, [run_id])
    stored = database.fetchall("SELECT count(*) FROM trace_events WHERE run_id = $1", [run_id])[0][0]
    rejects = database.fetchall("SELECT count(*) FROM rejects WHERE run_id = $1", [run_id])[0][0]
    totals = {"events stored": stored, "rejected messages": rejects, "ranks reporting": rows.num_rows,
              "ranks that ended cleanly": sum(bool(v) for v in rows["ended"].to_pylist())}
    if not rows.num_rows:
        return None, totals
    for name in ("sent", "dropped", "spooled"):
        totals[f"events {name}"] = int(sum(v or 0 for v in rows[name].to_pylist()))
    ranks = rows["rank"].to_pylist()
    data = [{"type": "bar", "name": name, "x": ranks, "y": rows[name].to_pylist(), "marker": {"color": color}}
            for name, color in (("sent", "#4c78a8"), ("spooled", "#f58518"), ("dropped", "#d62728"))]
    return Chart("ingest", "Ingest health", {"data": data, "layout": _layout(
        "rank", "events (log scale)", 300, yaxis={"type": "log", "title": {"text": "events"}}, barmode="group",
        xaxis=_rank_axis(len(ranks)))},
        "What each rank's producer sent, spooled for later (no broker) and dropped (buffer full), "
        "from its last heartbeat.", 300), totals
