"""The run analyses (merge, steps, communication, breakdown, timeline) on runs with known truth."""

import gzip
import json
import subprocess
import sys

import duckdb
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankstream.schemas.errors import BadInput
from rankstream.flows.breakdown import analyze_breakdown, compare_runs
from rankstream.flows.chrome_trace import check_chrome_trace
from rankstream.flows.comms import analyze_communication
from rankstream.flows.clocks import clock_offsets, align_clocks
from rankstream.flows.pipeline import analyze_everything
from rankstream.flows.steps import analyze_steps
from rankstream.flows.timeline import write_timeline

from .run_builder import MS, PHASES, build_run


def rows(db_path, sql, params=None):
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        return con.sql(sql, params=params).to_arrow_table().to_pylist()
    finally:
        con.close()


@pytest.fixture
def db(tmp_path):
    return tmp_path / "analyses.duckdb"


def test_skewed_clocks_are_recovered_within_their_error_bound(db):
    skew = {0: 0, 1: 37 * MS, 2: -250 * MS, 3: 1_500 * MS}
    built = build_run(db, skew_ns=skew)
    align_clocks(db, built.run_id)
    estimates = clock_offsets(db, built.run_id)
    chosen = {e["rank"]: e for e in estimates if e["chosen"]}
    assert set(chosen) == set(skew)
    for rank, estimate in chosen.items():
        truth = skew[rank] - skew[0]
        assert estimate["source"] == ("same_host" if rank == 0 else "barrier")  # each rank on a host of its own
        assert abs(estimate["offset_ns"] - truth) <= estimate["error_ns"], (rank, estimate, truth)
        assert estimate["error_ns"] < 400_000  # intersecting rounds is at least as tight as the best round
    # the Flight Recorder cross-check agrees with the barrier within their combined uncertainty
    fr = {e["rank"]: e for e in estimates if e["source"] == "flight_recorder"}
    assert set(fr) == set(skew) and all(e["agrees"] for e in fr.values())
    # the aligned view puts every rank's step markers back together
    spread = rows(db, "SELECT max(ts_ns) - min(ts_ns) AS spread FROM aligned_events "
                      "WHERE run_id = ? AND name = 'step' GROUP BY step", [built.run_id])
    assert max(r["spread"] for r in spread) < 1 * MS + built.slow_ns  # only the slow rank's own lateness remains


def test_ranks_on_one_host_read_one_clock_whatever_a_loose_barrier_round_says(db):
    """One host, one wall clock: a single clock-sync round with a 40-400 ms bound (a busy machine)
    gave offsets up to 74 ms, and the straggler threshold could not go below that bound."""
    from rankstream.consumers.query import connect
    from rankstream.flows.clocks import rank_offsets

    built = build_run(db, clock_rounds=1)
    with duckdb.connect(str(db)) as con:  # the round's readings scattered as a loaded host's are
        con.execute("UPDATE rank_metadata SET clock_sync_ns = clock_sync_ns + rank * 70 * 1000000, "
                    "clock_error_ns = 365 * 1000000")
    assert rank_offsets(connect(db), built.run_id) == ({rank: 0 for rank in range(4)}, 0)  # live, before alignment
    align_clocks(db, built.run_id)
    chosen = {e["rank"]: e for e in clock_offsets(db, built.run_id) if e["chosen"]}
    assert {(e["source"], e["offset_ns"], e["error_ns"]) for e in chosen.values()} == {("same_host", 0, 0)}
    assert rank_offsets(connect(db), built.run_id) == ({rank: 0 for rank in range(4)}, 0)


def test_aligned_view_namespaces_flow_and_correlation_ids_per_rank(db):
    built = build_run(db, world_size=2, steps=1)
    con = duckdb.connect(str(db))
    con.execute("UPDATE trace_events SET flow_id = 7, correlation_id = 9 WHERE run_id = ?", [built.run_id])
    con.close()
    ids = rows(db, "SELECT DISTINCT rank, pid, flow_id, correlation_id FROM aligned_events WHERE run_id = ? "
                   "ORDER BY rank", [built.run_id])
    assert [r["pid"] for r in ids] == [0, 1]
    assert len({r["flow_id"] for r in ids}) == 2 and len({r["correlation_id"] for r in ids}) == 2
    assert all(r["flow_id"] & ((1 << 40) - 1) == 7 for r in ids)


def test_step_trace_splits_each_step_into_its_phases_and_finds_the_slow_rank(db):
    built = build_run(db, slow_rank=2, slow_ns=15 * MS, p2p=False)
    align_clocks(db, built.run_id)
    analyze_steps(db, built.run_id)
    steps = rows(db, "SELECT * FROM step_trace WHERE run_id = ? ORDER BY step, rank", [built.run_id])
    assert len(steps) == built.world_size * built.steps
    lengths = dict(PHASES)
    for row in steps:
        assert row["data_ns"] == lengths["data"] * MS
        assert row["forward_ns"] == lengths["forward"] * MS
        assert row["backward_ns"] == lengths["backward"] * MS
        assert row["optimizer_ns"] == lengths["optimizer"] * MS
        waited = 0 if row["rank"] == built.slow_rank else built.slow_ns
        # the all-reduce span and the FR entry cover the same time: counted once
        assert abs(row["communication_ns"] - (lengths["allreduce"] * MS + waited)) <= 20_000
        slept = built.slow_ns if row["rank"] == built.slow_rank else 0
        assert abs(row["other_ns"] - slept) <= 20_000
        assert row["iteration_interval_ns"] == slept + lengths["data"] * MS
    slowest = rows(db, "SELECT rank, ranking, times_slowest FROM rank_slowness WHERE run_id = ? ORDER BY ranking",
                   [built.run_id])
    assert slowest[0]["rank"] == built.slow_rank and slowest[0]["times_slowest"] == built.steps


def test_the_last_step_ends_at_its_last_work_and_never_when_an_optimizer_mark_opened_it(db):
    """Rank 0's marks come from `run`'s optimizer hook: its last step is teardown (or a hang), with
    no end. Rank 1 marks the top of its loop: its last step ends at its last span, not at the exit
    record that came 10 s later."""
    built = build_run(db, world_size=2, steps=3, slow_rank=None)
    con = duckdb.connect(str(db))
    con.execute("""UPDATE trace_events SET args = '{"marked_by": "optimizer"}' WHERE rank = 0 AND cat = 'step'""")
    last_work = dict(con.execute("SELECT rank, max(ts_ns + dur_ns) FROM trace_events WHERE step = 2 GROUP BY rank")
                     .fetchall())
    for rank, end in last_work.items():
        con.execute("INSERT INTO trace_events (run_id, rank, name, cat, ph, ts_ns, dur_ns, pid, tid, step) "
                    "VALUES (?, ?, 'process_exit', 'rankstream', 'i', ?, 0, ?, 0, 2)",
                    [built.run_id, rank, end + 10_000 * MS, 100 + rank])
    con.close()
    steps = rows(db, "SELECT rank, step, end_ns, finished FROM run_steps(?) ORDER BY rank, step", [built.run_id])
    assert [(s["rank"], s["step"], s["finished"]) for s in steps] == [
        (0, 0, True), (0, 1, True), (0, 2, False), (1, 0, True), (1, 1, True), (1, 2, True)]
    assert steps[2]["end_ns"] == last_work[0] + 10_000 * MS  # open: to the rank's last event, for timelines
    assert steps[-1]["end_ns"] == last_work[1]
    analyze_steps(db, built.run_id)
    timed = rows(db, "SELECT rank, step FROM step_trace WHERE run_id = ? ORDER BY rank, step", [built.run_id])
    assert [(s["rank"], s["step"]) for s in timed] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]


def test_unmatched_begin_is_closed_at_the_ranks_last_event_and_flagged(db):
    built = build_run(db, world_size=2, steps=2)
    con = duckdb.connect(str(db))
    last = con.execute("SELECT max(ts_ns + dur_ns) FROM trace_events WHERE rank = 1").fetchall()[0][0]
    con.execute("DELETE FROM trace_events WHERE rank = 1 AND name = 'data' AND ph = 'E' AND step = 1")
    con.close()
    spans = rows(db, "SELECT step, end_ns, unfinished FROM run_intervals(?) WHERE rank = 1 AND name = 'data' "
                     "ORDER BY step", [built.run_id])
    assert [s["unfinished"] for s in spans] == [False, True]
    assert spans[1]["end_ns"] == last


def test_communication_summary_and_matrix_add_up_to_the_flight_recorder_entries(db):
    built = build_run(db, world_size=4, steps=5)
    align_clocks(db, built.run_id)
    analyze_communication(db, built.run_id)
    matrix = rows(db, "SELECT * FROM comm_matrix WHERE run_id = ?", [built.run_id])
    for rank, total in built.fr_bytes.items():
        sent = sum(m["bytes"] for m in matrix if m["kind"] == "collective" and m["src_rank"] == rank)
        assert sent == pytest.approx(total)
    p2p = {(m["src_rank"], m["dst_rank"]): m["bytes"] for m in matrix if m["kind"] == "p2p"}
    assert p2p == {pair: pytest.approx(b) for pair, b in built.fr_send_bytes.items()}
    summary = {r["op"]: r for r in rows(db, "SELECT * FROM comm_summary WHERE run_id = ?", [built.run_id])}
    reduce = summary["all_reduce"]
    assert reduce["calls"] == built.steps and reduce["rank_entries"] == built.steps * built.world_size
    assert reduce["total_bytes"] == sum(built.fr_bytes.values())
    assert reduce["time_source"] == "flight_recorder"
    # peers of the slow rank wait for it in every all-reduce; the transfer itself is the rest
    assert reduce["wait_ns"] == pytest.approx(built.slow_ns * built.steps * (built.world_size - 1), rel=0.01)
    assert reduce["wait_ns"] + reduce["transfer_ns"] == pytest.approx(reduce["total_ns"], rel=0.001)


def test_gloo_entries_without_times_take_their_time_from_the_backend_spans(db):
    built = build_run(db, fr_times=False, p2p=False)
    align_clocks(db, built.run_id)
    analyze_communication(db, built.run_id)
    reduce = rows(db, "SELECT * FROM comm_summary WHERE run_id = ? AND op = 'all_reduce'", [built.run_id])[0]
    assert reduce["time_source"] == "profiler"
    assert reduce["mean_ns"] == pytest.approx(6 * MS + built.slow_ns * 3 / 4, rel=0.01)


def test_temporal_breakdown_counts_nested_ops_once_and_overlap_where_they_meet(db):
    built = build_run(db, world_size=2, steps=3, slow_rank=None)
    align_clocks(db, built.run_id)
    analyze_breakdown(db, built.run_id)
    lengths = dict(PHASES)
    for row in rows(db, "SELECT * FROM cpu_temporal_breakdown WHERE run_id = ?", [built.run_id]):
        compute = built.steps * ((lengths["forward"] - 2) + (lengths["backward"] - 2)) * MS  # the aten::mm ops
        assert abs(row["cpu_compute_ns"] - compute) <= 1000
        assert row["cpu_compute_ns"] + row["cpu_communication_ns"] - row["cpu_overlap_ns"] + row["cpu_idle_ns"] == row["span_ns"]
    ops = rows(db, "SELECT name, ranks, calls, position FROM op_stats WHERE run_id = ? ORDER BY position", [built.run_id])
    assert ops[0]["name"] == "aten::mm" and ops[0]["ranks"] == 2 and ops[0]["calls"] == 2 * 2 * built.steps


def test_temporal_breakdown_does_not_depend_on_the_ranks_clocks(tmp_path):
    """The unions are taken on each rank's own clock, its Flight Recorder calls moved back onto it:
    a skewed run breaks down as the same run with true clocks does."""
    columns = "rank, span_ns, cpu_compute_ns, cpu_communication_ns, cpu_overlap_ns, cpu_idle_ns"
    breakdowns = []
    for name, skew in (("true", None), ("skewed", {0: 0, 1: 7 * MS, 2: -3 * MS})):
        db = tmp_path / f"{name}.duckdb"
        built = build_run(db, world_size=3, steps=3, slow_rank=1, skew_ns=skew)
        align_clocks(db, built.run_id)
        analyze_breakdown(db, built.run_id)
        breakdowns.append(rows(db, f"SELECT {columns} FROM cpu_temporal_breakdown WHERE run_id = ? ORDER BY rank",
                               [built.run_id]))
    assert [row["rank"] for row in breakdowns[0]] == [0, 1, 2]
    assert all(row["cpu_communication_ns"] > 0 for row in breakdowns[0])
    for true, skewed in zip(*breakdowns):
        assert all(abs(true[key] - skewed[key]) <= 50_000 for key in true), (true, skewed)


def test_timeline_is_valid_chrome_json_with_every_rank_and_split_by_step_range(db, tmp_path):
    built = build_run(db, steps=8)
    analyze_everything(db, built.run_id)
    whole = write_timeline(db, built.run_id, tmp_path / "t.json.gz")
    problems, summary = check_chrome_trace(whole.files[0])
    assert problems == [] and summary["pids"] == list(range(built.world_size))
    assert "B" not in summary["phases"] and "E" not in summary["phases"]  # B/E pairs become X events
    with gzip.open(whole.files[0], "rt") as handle:
        events = json.load(handle)["traceEvents"]
    collectives = [e for e in events if e.get("cat") == "collective"]
    assert len(collectives) == len(rows(db, "SELECT * FROM fr_entries WHERE run_id = ?", [built.run_id]))
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert any(n.startswith("collectives: default_pg") for n in names)
    split = write_timeline(db, built.run_id, tmp_path / "s.json", max_events=100)
    assert split.split and len(split.files) > 1
    assert [p.name for p in split.files][0].startswith("s.steps0-")
    total = 0
    for path in split.files:
        problems, summary = check_chrome_trace(path)
        assert problems == [] and summary["pids"] == list(range(built.world_size))
        total += sum(n for ph, n in summary["phases"].items() if ph != "M")
    assert total == sum(n for ph, n in check_chrome_trace(whole.files[0])[1]["phases"].items() if ph != "M")
    some = write_timeline(db, built.run_id, tmp_path / "r.json", ranks=[1, 3], steps="2:3")
    problems, summary = check_chrome_trace(some.files[0])
    assert problems == [] and summary["pids"] == [1, 3]
    with pytest.raises(BadInput, match="no such steps"):
        write_timeline(db, built.run_id, tmp_path / "x.json", steps="50:60")


def test_a_split_timeline_counts_the_setup_before_the_first_step_in_its_first_file(db, tmp_path):
    """Events before the first step (a job's setup, untagged) fall in the first file: the plan
    counts them there, so no file holds more than the limit allows."""
    built = build_run(db, steps=8, p2p=False)
    first = rows(db, "SELECT min(ts_ns) AS t FROM trace_events WHERE run_id = ?", [built.run_id])[0]["t"]
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO trace_events (run_id, rank, name, cat, ph, ts_ns, dur_ns, pid, tid) "
                "SELECT ?, 0, 'setup', 'cpu_op', 'X', ? - 1000000000 + i * 1000, 500, 100, 1 FROM range(60) t(i)",
                [built.run_id, first])
    con.close()
    limit = 100
    split = write_timeline(db, built.run_id, tmp_path / "s.json", max_events=limit)
    assert split.split
    counts = []  # trace events per file: track names, FR slices and findings come on top
    for path in split.files:
        events = json.loads(path.read_text())["traceEvents"]
        counts.append(sum(1 for e in events if e["ph"] != "M" and e.get("cat") not in ("collective", "finding")))
    whole = json.loads(write_timeline(db, built.run_id, tmp_path / "w.json").files[0].read_text())["traceEvents"]
    assert sum(counts) == sum(1 for e in whole if e["ph"] != "M" and e.get("cat") not in ("collective", "finding"))
    assert all(count <= limit for count in counts), counts
    assert counts[0] >= 60


def test_timeline_fetched_in_small_slices_is_the_same_file(db, tmp_path, monkeypatch):
    import rankstream.flows.timeline as timeline

    built = build_run(db, steps=4)
    whole = write_timeline(db, built.run_id, tmp_path / "whole.json")
    monkeypatch.setattr(timeline, "SLICE_EVENTS", 7)
    sliced = write_timeline(db, built.run_id, tmp_path / "sliced.json")
    load = lambda path: sorted(json.dumps(e, sort_keys=True) for e in json.loads(path.read_text())["traceEvents"])
    assert sliced.events == whole.events and load(sliced.files[0]) == load(whole.files[0])


def test_timeline_puts_every_event_of_skewed_ranks_at_its_aligned_time(db, tmp_path, monkeypatch):
    """Each slice is read on its rank's own clock (the slice's bounds moved by the rank's offset):
    what comes out, sliced finely, is the aligned view itself."""
    import rankstream.flows.timeline as timeline

    built = build_run(db, steps=4, skew_ns={0: 0, 1: 37 * MS, 2: -250 * MS, 3: 1_500 * MS})
    align_clocks(db, built.run_id)
    assert len({e["offset_ns"] for e in clock_offsets(db, built.run_id) if e["chosen"]}) == 4
    monkeypatch.setattr(timeline, "SLICE_EVENTS", 7)
    events = json.loads(write_timeline(db, built.run_id, tmp_path / "t.json").files[0].read_text())["traceEvents"]
    t0 = rows(db, "SELECT min(ts_ns) AS t0 FROM aligned_events WHERE run_id = ?", [built.run_id])[0]["t0"]
    written = sorted((e["pid"], e["name"], e["ph"], round(e["ts"] * 1000), round(e.get("dur", 0) * 1000))
                     for e in events if e["ph"] in ("X", "i") and e.get("cat") not in ("collective", "finding"))
    spans = rows(db, "SELECT * FROM run_intervals(?)", [built.run_id])
    instants = rows(db, "SELECT * FROM aligned_events WHERE run_id = ? AND ph = 'i'", [built.run_id])
    assert written == sorted([(r["rank"], r["name"], "X", r["start_ns"] - t0, r["end_ns"] - r["start_ns"]) for r in spans]
                             + [(r["rank"], r["name"], "i", r["ts_ns"] - t0, 0) for r in instants])


def test_the_trace_checker_finds_what_viewers_reject(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"ph": "B", "name": "a", "ts": 1, "pid": 0, "tid": 0},
                                {"ph": "X", "name": "b", "ts": "2", "pid": 0, "tid": 0},
                                {"ph": "X", "name": "d", "ts": 4, "pid": 0, "tid": 0},
                                {"ph": "C", "name": "c", "ts": 3, "pid": 0, "tid": 0, "args": {"v": "x"}}]))
    problems, _ = check_chrome_trace(path)
    assert any("'ts' must be a number" in p for p in problems)
    assert any("dur" in p for p in problems)
    assert any("counter args" in p for p in problems)
    assert any("never ended" in p for p in problems)


def test_two_runs_compare_step_time_and_ops(db):
    fast = build_run(db, run_id="fast", slow_rank=None)
    slow = build_run(db, run_id="slow", slow_rank=1, slow_ns=30 * MS)
    for run in (fast, slow):
        analyze_everything(db, run.run_id)
    diff = {r["metric"]: r for r in compare_runs(db, "fast", "slow")}
    assert diff["step: mean_ms"]["delta"] == pytest.approx(30, rel=0.01)  # ms, as everywhere in the report
    assert "op ms per step per rank: aten::mm" in diff


def test_analyses_refuse_an_unknown_run(db):
    build_run(db, world_size=2, steps=1)
    with pytest.raises(BadInput, match="no data for run 'nope'"):
        analyze_everything(db, "nope")


def test_only_the_analyses_named_run_in_dependency_order_and_the_file_is_free_after(db):
    built = build_run(db, world_size=2, steps=2)
    seconds = analyze_everything(db, built.run_id, only=["steps", "clocks"])
    assert list(seconds) == ["clocks", "steps"]
    done = {r["analysis"] for r in rows(db, "SELECT analysis FROM analyses_done WHERE run_id = ?", [built.run_id])}
    assert done == {"clocks", "steps"}
    assert rows(db, "SELECT count(*) AS n FROM step_trace")[0]["n"] == 2 * 2
    assert rows(db, "SELECT count(*) AS n FROM cpu_temporal_breakdown")[0]["n"] == 0
    # the analyses' shared connection is closed: another process can open the file for writing
    opened = subprocess.run([sys.executable, "-c", "import duckdb, sys; duckdb.connect(sys.argv[1]).close()", str(db)])
    assert opened.returncode == 0
    with pytest.raises(BadInput, match=r"unknown analyses \['steps2'\]"):
        analyze_everything(db, built.run_id, only=["steps2"])


def test_the_report_tells_a_healthy_run_from_one_never_analyzed(db):
    from rich.console import Console

    from rankstream.flows.report import gather_report, render_run_report

    build_run(db, run_id="healthy", slow_rank=None, p2p=False)
    build_run(db, run_id="unchecked", slow_rank=None, p2p=False)
    with duckdb.connect(str(db)) as con:  # the builder varies sizes per rank; here every rank agrees
        con.execute("UPDATE fr_entries SET input_sizes = [[1024]], output_sizes = [[1024]]")
    analyze_everything(db, "healthy")
    analyze_everything(db, "unchecked", collectives=False)
    text = {}
    for run in ("healthy", "unchecked"):
        console = Console(record=True, width=200)
        report = gather_report(db, run)
        assert report["findings"] == []
        render_run_report(run, report, console)
        text[run] = console.export_text()
    assert text["healthy"].splitlines()[1] == "verdict: HEALTHY: no problem found"
    assert "Collective findings (the first is the root cause): none (verdict: healthy)" in text["healthy"]
    assert text["unchecked"].splitlines()[1].startswith("verdict: no collective diagnosis")
    assert "Collective findings (the first is the root cause): no data" in text["unchecked"]
    assert "more than one process" not in text["healthy"]
    assert "slowest rank:" not in text["healthy"]  # every rank within noise: no headline


def test_the_text_report_prints_what_the_data_says_even_where_it_looks_like_markup():
    """gloo's errors start with ``[/__w/...]``, a closing tag to rich: a crash's headline made the
    report fail (live probe), and brackets in a cell vanished."""
    from rich.console import Console

    from rankstream.flows.report import render_run_report

    detail = "rank 0 ended on uncaught RuntimeError: [/__w/gloo/pair.cc:553] Connection closed [bold]"
    report = {"analyses": [{"analysis": "collectives", "detail": "crash"}],
              "findings": [{"kind": "dead_rank", "detail": detail}]}
    console = Console(record=True, width=300)
    render_run_report("[run]", report, console)
    lines = console.export_text().splitlines()
    assert lines[:2] == ["run [run]", f"verdict: CRASH: root cause: {detail}"]
    assert any("[/__w/gloo/pair.cc:553]" in line for line in lines[2:])  # the findings table


def test_sql_output_prints_values_that_look_like_markup_as_they_are(capsys):
    import pyarrow as pa

    from rankstream.cli.data import print_table

    print_table(pa.table({"name": ["void kernel<float>[/__w/a.cu:5]", "[bold]x"]}), "table")
    out = capsys.readouterr().out
    assert "void kernel<float>[/__w/a.cu:5]" in out and "[bold]x" in out


def test_the_text_report_leads_with_the_verdict_and_fits_120_columns(db):
    from rich.console import Console

    from rankstream.flows.report import gather_report, render_run_report

    build_run(db, run_id="slow", slow_rank=2, p2p=False)
    analyze_everything(db, "slow", collectives=False)
    console = Console(record=True, width=300)  # a wide terminal: the report still keeps to 120
    render_run_report("slow", gather_report(db, "slow"), console)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 120
    assert lines[1].startswith("verdict:") and lines[2].startswith("slowest rank: 2")
    steps = next(i for i, line in enumerate(lines) if line.startswith("Step time per rank (ms)"))
    assert "p99_ms" in lines[steps + 2] and "worst_steps" in lines[steps + 2]
    assert not any(header in line for line in lines for header in ("_ns ", "_us ", "offset_us"))
    assert any(line.startswith("legend:") for line in lines)


def test_the_report_and_status_warn_when_a_rank_came_from_two_processes(db, tmp_path):
    from rich.console import Console

    from rankstream.flows.report import gather_report, render_run_report
    from rankstream.schemas.settings import load_config
    from rankstream.status import collect_status, render_status

    build_run(db, run_id="mixed", slow_rank=None, p2p=False)
    with duckdb.connect(str(db)) as con:  # a second launch under the same run id: rank 2 again, another process
        con.execute("INSERT INTO rank_metadata SELECT * REPLACE ('other' AS session_id) FROM rank_metadata "
                    "WHERE run_id = 'mixed' AND rank = 2 LIMIT 1")
    console = Console(record=True, width=200)
    render_run_report("mixed", gather_report(db, "mixed"), console)
    assert "rank(s) 2 were sent by more than one process" in console.export_text()
    console = Console(record=True, width=200)
    render_status(collect_status(load_config({"db_path": db, "state_dir": tmp_path / "state"}, env={})), console)
    assert "1 rank(s) were sent by more than one process" in console.export_text()


def test_status_tells_a_run_that_went_silent_from_one_running_and_one_that_ended(db, tmp_path):
    """A run killed before its ranks said goodbye (``--on-hang kill``, a crash) never gets an end;
    once nothing was heard from it for a while, status says so instead of "running"."""
    import time

    from rankstream.schemas.settings import load_config
    from rankstream.status import SILENT_AFTER_S, collect_status

    build_run(db, run_id="killed")  # its heartbeats were sent long ago, and none was final
    build_run(db, run_id="done", finished=True)
    build_run(db, run_id="live")
    with duckdb.connect(str(db)) as con:  # a heartbeat from a second ago: still going
        con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final) "
                    "VALUES ('live', 0, 's0', $1, false)", [time.time_ns() - 10**9])
        for run in ("killed", "live"):  # an episode the hang watch left open in each
            con.execute("INSERT INTO live_findings (run_id, kind, culprit_ranks, waiting_ranks, first_seen_ns, "
                        "last_seen_ns, detail) VALUES ($1, 'skipped_collective', [1], [0], 1, 2, 'rank 1 skipped')",
                        [run])
    report = collect_status(load_config({"db_path": db, "state_dir": tmp_path / "state"}, env={}))
    states = {run["run_id"]: run["state"] for run in report["runs"]}
    assert states["killed"].startswith("silent since ") and states["done"].startswith("ended ")
    assert states["live"] == "running" and SILENT_AFTER_S >= 10
    assert [f["run_id"] for f in report["live_findings"]] == ["live"]  # the killed run hangs no more


def test_the_end_of_run_trigger_takes_runs_that_went_silent_and_again_when_they_end(db):
    """A killed run never ends, yet it is the one most in need of its analyses."""
    import time

    from rankstream.flows.pipeline import finished_runs_to_analyze
    from rankstream.flows.run_tables import replace_run_rows

    build_run(db, run_id="killed")  # heard from long ago, no final heartbeat
    build_run(db, run_id="done", finished=True)
    build_run(db, run_id="live")
    with duckdb.connect(str(db)) as con:
        con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final) "
                    "VALUES ('live', 0, 's0', $1, false)", [time.time_ns()])
    assert sorted(finished_runs_to_analyze(db)) == [("done", "end_of_run"), ("killed", "went_silent")]
    replace_run_rows(db, "killed", "went_silent", tables=[], statements=[])
    assert finished_runs_to_analyze(db) == [("done", "end_of_run")]
    with duckdb.connect(str(db)) as con:  # it was only cut off: its ranks come back and say goodbye
        con.execute("INSERT INTO heartbeats (run_id, rank, session_id, sent_ns, final) "
                    "SELECT 'killed', rank, 's' || rank, $1, true FROM range(4) t(rank)", [time.time_ns()])
    assert sorted(finished_runs_to_analyze(db)) == [("done", "end_of_run"), ("killed", "end_of_run")]


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 50), st.booleans()), max_size=60))
def test_union_lengths_count_every_covered_instant_once(intervals):
    from rankstream.flows.breakdown import _union_ns

    def covered(chosen):  # the instants [t, t+1) some interval covers, counted one by one
        return len({t for start, length in chosen for t in range(start, start + length)})

    ordered = sorted(intervals, key=lambda i: i[0])
    for chosen in (ordered, [i for i in ordered if i[2]]):
        starts = np.array([i[0] for i in chosen], dtype=np.int64)
        ends = np.array([i[0] + i[1] for i in chosen], dtype=np.int64)
        assert _union_ns(starts, ends) == covered([(s, n) for s, n, _ in chosen])


@pytest.mark.parametrize("pass_per_rank", [0, 100])  # ranks grouped by a sort, or by one pass per rank
def test_union_lengths_per_rank_whichever_way_ranks_are_grouped(pass_per_rank, monkeypatch):
    import random

    import rankstream.flows.breakdown as breakdown
    from rankstream.schemas.tables import ddl

    monkeypatch.setattr(breakdown, "_PASS_PER_RANK", pass_per_rank)
    rng = random.Random(3)
    events = [(rank, name, rng.randint(0, 300), rng.randint(0, 40)) for rank in (0, 3, 7, 20, 21) for _ in range(40)
              for name in (rng.choice(["aten::mm", "gloo:all_reduce"]),)]
    con = duckdb.connect()
    con.execute(ddl())
    for rank, name, start, length in events:
        con.execute("INSERT INTO trace_events (run_id, rank, name, cat, ph, ts_ns, dur_ns) VALUES "
                    "('r', ?, ?, 'cpu_op', 'X', ?, ?)", [rank, name, start, length])
    breakdown.union_lengths(con, {"run": "r"})
    found = {row[0]: row[1:] for row in con.execute("SELECT rank, compute_ns, comm_ns, busy_ns FROM _unions").fetchall()}

    def covered(rank, names):
        return len({t for r, name, start, length in events if r == rank and name in names
                    for t in range(start, start + length)})

    assert found == {rank: (covered(rank, {"aten::mm"}), covered(rank, {"gloo:all_reduce"}),
                            covered(rank, {"aten::mm", "gloo:all_reduce"})) for rank in (0, 3, 7, 20, 21)}
