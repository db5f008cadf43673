"""rankstream's analyses against Composer's trace merge and Holistic Trace Analysis, same inputs.

1. **Merge against Composer.** N per-rank Composer traces (``bench/trace_files.py``, about
   ``--merge-mb`` MB each). Composer's published merger (``composer.profiler.json_trace_merger``
   from the ``mosaicml`` wheel, when installed) and a leaner re-implementation of its algorithm
   (``bench/composer_merge.py``: one parse fewer per file, C-encoded lines) each merge them into
   one JSON file; rankstream imports them through the bus (broker and materializer already up, as
   in production), aligns the clocks and writes the timeline. Wall time and peak RSS of each side's
   processes (rankstream's includes its materializer) are printed, at ``--merge-mb`` and at twice
   that, to show whether memory grows with the trace size. Then the same files through
   ``rankstream merge``, which does all three in one command with no broker; and that command
   alone on larger files (``--memory-mb``), where the peers would take minutes, for its memory.
2. **Analysis against HTA.** Kineto traces of ``--hta-events`` events over 2 ranks: HTA loads them
   and computes its temporal breakdown; rankstream imports the same files and runs its step
   analysis and temporal breakdown. Then, on ``--events`` (default 10M) events already in DuckDB,
   rankstream's step analysis plus temporal breakdown alone (target: 2 s), timed in a fresh
   process after its imports, and as one ``rankstream analyze run`` command.

Usage: python bench/analysis.py [--merge-files 2] [--merge-mb 36] [--memory-mb 144,288] [--hta-events 400000]
       [--events 10000000] [--skip merge,hta,materialized]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from measure import run_measured
from trace_files import write_composer_trace, write_kineto_trace

from rankstream.schemas.settings import config_env, load_config
from rankstream.services import down, up

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MaterializerRss:
    """Peak RSS of the running materializer while the block runs (sampled every 50 ms)."""

    def __init__(self, config) -> None:
        import psutil

        from rankstream.services import materializer_pid

        self._process = psutil.Process(materializer_pid(config))
        self._stop = threading.Event()
        self.peak_mb = 0.0

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak_mb = max(self.peak_mb, self._process.memory_info().rss / 2**20)

    def __enter__(self) -> "MaterializerRss":
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()


def _succeeded(command: list[str], timeout: float, env: dict | None = None) -> tuple[str, float, float]:
    """``run_measured``'s (output, wall s, peak RSS MB) of a command that must succeed."""
    output, wall, rss, code = run_measured(command, timeout, env)
    if code != 0:
        raise SystemExit(f"{' '.join(command[1:])} failed:\n{output[-2000:]}")
    return output, wall, rss


def _rankstream(config, *args, timeout=900) -> tuple[float, float]:
    """(wall s, peak RSS MB of the command's process tree; the materializer is measured apart)."""
    _, wall, rss = _succeeded([sys.executable, "-m", "rankstream", *args], timeout,
                              {**os.environ, **config_env(config)})
    return wall, rss


def _composer_traces(root: Path, files: int, megabytes: float) -> tuple[list[Path], int]:
    """N per-rank Composer traces of about ``megabytes`` MB each in ``root``, and their event count."""
    paths = [root / f"rank{r}.json" for r in range(files)]
    events = sum(write_composer_trace(p, r, int(megabytes * 1e6), skew_us=1000 * r) for r, p in enumerate(paths))
    return paths, events


def merge_memory_round(root: Path, files: int, megabytes: float, config) -> tuple[float, float]:
    """(wall s, peak RSS MB) of ``rankstream merge`` on N files of about ``megabytes`` MB each."""
    paths, _ = _composer_traces(root, files, megabytes)
    return _rankstream(config, "merge", *map(str, paths), "-o", str(root / "merged.json"), timeout=1800)


def composer_mergers() -> dict[str, list[str]]:
    """The Composer merge commands to measure, each taking ``-o OUTPUT FILE...``.

    "published" is Composer's own ``json_trace_merger.py`` from the installed ``mosaicml`` wheel
    (``pip install --no-deps mosaicml==0.32.1``), run as a script by its path: importing the
    ``composer`` package would pull in torch-pinned dependencies the merger does not use.
    "lean" is ``bench/composer_merge.py``, always measured: it parses each file three times
    instead of four and encodes lines in C, so it is the stricter peer."""
    import importlib.util

    mergers = {}
    spec = importlib.util.find_spec("composer")  # finds the package without importing it
    if spec is not None and spec.submodule_search_locations:
        published = Path(spec.submodule_search_locations[0]) / "profiler" / "json_trace_merger.py"
        if published.is_file():
            mergers["published"] = [sys.executable, str(published)]
    mergers["lean"] = [sys.executable, str(HERE / "composer_merge.py")]
    return mergers


def merge_round(root: Path, files: int, megabytes: float, config) -> dict:
    paths, events = _composer_traces(root, files, megabytes)
    composer = {}
    for name, command in composer_mergers().items():
        _, seconds, megabytes_peak = _succeeded([*command, "-o", str(root / f"composer_{name}.json"), *map(str, paths)],
                                                1800)
        composer[name] = (seconds, megabytes_peak)
    run = f"merge-{files}x{megabytes:g}"
    with MaterializerRss(config) as materializer:
        steps = [
            _rankstream(config, "import", "trace", *map(str, paths), "--run", run),
            _rankstream(config, "analyze", "run", "--run", run, "--only", "clocks"),
            _rankstream(config, "timeline", "--run", run, "-o", str(root / f"{run}.json")),
        ]
    one_command = _rankstream(config, "merge", *map(str, paths), "-o", str(root / f"{run}-one-command.json"))
    return {"files": files, "mb_each": megabytes, "events": events, "composer": composer,
            "rankstream_s": sum(s for s, _ in steps), "import_s": steps[0][0], "merge_s": steps[1][0],
            "timeline_s": steps[2][0], "rankstream_mb": max(m for _, m in steps),
            "import_mb": steps[0][1], "timeline_mb": steps[2][1],
            "materializer_mb": materializer.peak_mb, "merge_command_s": one_command[0],
            "merge_command_mb": one_command[1]}


HTA_SCRIPT = """
import sys, time
from hta.trace_analysis import TraceAnalysis
started = time.perf_counter()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
loaded = time.perf_counter()
analysis.get_temporal_breakdown(visualize=False)
print(f"HTA load_s={loaded - started:.3f} breakdown_s={time.perf_counter() - loaded:.3f}")
"""


def hta_round(root: Path, events: int, config) -> dict:
    traces = root / "hta"
    traces.mkdir()
    for rank in range(2):
        write_kineto_trace(traces / f"rank{rank}.json", rank, 2, events // 2)
    result = {"events": events}
    try:
        import hta  # noqa: F401  (only: is HTA installed?)
        output, wall, rss, code = run_measured([sys.executable, "-c", HTA_SCRIPT, str(traces)], 3600)
        result.update(hta_s=wall if code == 0 else None, hta_mb=rss, hta_detail=output.strip().splitlines()[-1:])
    except ImportError:
        result.update(hta_s=None, hta_detail=["HolisticTraceAnalysis not installed (pip install --no-deps "
                                              "HolisticTraceAnalysis pandas plotly networkx pydot)"])
    run = "hta-traces"
    with MaterializerRss(config) as materializer:
        steps = [_rankstream(config, "import", "trace", *map(str, sorted(traces.glob("*.json"))), "--run", run),
                 _rankstream(config, "analyze", "run", "--run", run, "--only", "clocks,steps,breakdown")]
    result.update(rankstream_s=sum(s for s, _ in steps), rankstream_mb=max(m for _, m in steps),
                  materializer_mb=materializer.peak_mb,
                  import_s=steps[0][0], analysis_s=steps[1][0])
    return result


def build_materialized(db: Path, events: int, ranks: int = 8) -> int:
    """``events`` trace events of run 'big' written straight into a DuckDB file: ops, phase
    annotations and step markers of ``ranks`` ranks. Returns the number of rows."""
    import duckdb

    from rankstream.schemas.tables import ddl

    con = duckdb.connect(str(db))
    con.execute(ddl())
    con.execute("SET enable_progress_bar = false")
    per_step = 1200  # ops per rank per step: groups of three nested ops (a CPU op calling two below it)
    con.execute(f"""
        INSERT INTO trace_events (run_id, rank, name, cat, ph, ts_ns, dur_ns, pid, tid, step)
        SELECT 'big', (i % {ranks})::INT, CASE WHEN g % 50 = 49 THEN ['c10d::allreduce_', 'gloo:all_reduce', 'aten::copy_'][1 + level]
                                          ELSE ['aten::linear', 'aten::addmm', 'aten::mm'][1 + level] END,
               'cpu_op', 'X', 1700000000000000000 + g * 10000 + level * 1000 + (i % {ranks}) * 37,
               9000 - level * 3000, 100 + (i % {ranks}), 1, (i // {ranks}) // {per_step}
        FROM (SELECT i, (i // {ranks}) // 3 AS g, ((i // {ranks}) % 3)::INT AS level FROM range({events}) t(i))""")
    steps = events // ranks // per_step
    span = per_step // 3 * 10000  # a step's length in ns
    con.execute(f"""
        INSERT INTO trace_events (run_id, rank, name, cat, ph, ts_ns, dur_ns, pid, tid, step)
        SELECT 'big', r::INT, p.name, 'user_annotation', 'X',
               1700000000000000000 + s * {span} + p.from_pct * {span} // 100 + r * 37, p.len * {span} // 100, 100 + r, 1, s
        FROM range({ranks}) a(r), range({steps}) b(s),
             (VALUES ('forward', 0, 40), ('backward', 40, 45), ('optimizer', 85, 15)) p(name, from_pct, len)
        UNION ALL
        SELECT 'big', r::INT, 'step', 'step', 'i', 1700000000000000000 + s * {span} + r * 37, 0, 100 + r, 1, s
        FROM range({ranks}) a(r), range({steps}) b(s)""")
    total = con.execute("SELECT count(*) FROM trace_events").fetchall()[0][0]
    con.close()
    return total


#: The analyses timed as ``rankstream analyze run`` runs them (``flows.pipeline.analyze_everything``:
#: merge first, one connection), in a process of their own after their imports (not in this one,
#: which has just written gigabytes of trace text).
ANALYSES_SCRIPT = """
import json, sys
from rankstream.flows.pipeline import analyze_everything
print(json.dumps(analyze_everything(sys.argv[1], "big", only=["clocks", "steps", "breakdown"])))
"""


def materialized_round(root: Path, events: int) -> dict:
    """Timed merge, step analysis and breakdown on ``events`` events already in DuckDB, in a fresh
    process; then the same analyses as one ``rankstream analyze run`` command (wall time, its
    interpreter and imports included)."""
    import json

    db = root / "materialized.duckdb"
    total = build_materialized(db, events)
    output, _, _ = _succeeded([sys.executable, "-c", ANALYSES_SCRIPT, str(db)], 600)
    timings = json.loads(output.strip().splitlines()[-1])
    _, command_s, _ = _succeeded([sys.executable, "-m", "rankstream", "--db", str(db), "--state-dir",
                                  str(root / "analyze-state"), "analyze", "run", "--run", "big", "--only",
                                  "clocks,steps,breakdown"], 600)
    return {"events": total, **timings, "command_s": command_s}


def _speedups(composer: dict[str, tuple[float, float]], seconds: float) -> str:
    return ", ".join(f"{composer_s / seconds:.1f}x vs {name}" for name, (composer_s, _) in composer.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--merge-files", type=int, default=2)
    parser.add_argument("--merge-mb", type=float, default=36)
    parser.add_argument("--memory-mb", default="144,288", help="comma list: larger files for rankstream merge alone")
    parser.add_argument("--hta-events", type=int, default=400_000)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--skip", default="", help="comma list of parts to skip: merge, hta, materialized")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    root = Path(tempfile.mkdtemp(prefix="rankstream-bench-analysis-"))
    config = load_config({"db_path": root / "bench.duckdb", "state_dir": root / "state", "broker_port": _free_port(),
                          "partitions": 4}, env={})
    up(config)
    try:
        if "merge" not in skip:
            print(f"== merge: {args.merge_files} Composer per-rank traces, import + merge + timeline vs Composer's merge")
            for megabytes in (args.merge_mb, 2 * args.merge_mb):
                (root / f"m{megabytes:g}").mkdir()
                row = merge_round(root / f"m{megabytes:g}", args.merge_files, megabytes, config)
                composer = row["composer"]
                print(f"  {row['files']} x {row['mb_each']:g} MB ({row['events']:,} events): composer "
                      + "; ".join(f"{name} {s:.1f} s / {mb:.0f} MB peak" for name, (s, mb) in composer.items()))
                print(f"    through the bus: rankstream {row['rankstream_s']:.1f} s (import {row['import_s']:.1f}, "
                      f"merge {row['merge_s']:.1f}, timeline {row['timeline_s']:.1f}), peak RSS import "
                      f"{row['import_mb']:.0f} MB, timeline {row['timeline_mb']:.0f} MB, materializer "
                      f"{row['materializer_mb']:.0f} MB; {_speedups(composer, row['rankstream_s'])}")
                print(f"    one command, no broker (rankstream merge): {row['merge_command_s']:.1f} s, "
                      f"{row['merge_command_mb']:.0f} MB peak; {_speedups(composer, row['merge_command_s'])}")
                if "published" not in composer:
                    print("    (Composer's published merger not measured: pip install --no-deps mosaicml==0.32.1)")
            for megabytes in (float(mb) for mb in args.memory_mb.split(",") if mb):
                (root / f"memory{megabytes:g}").mkdir()
                wall, rss = merge_memory_round(root / f"memory{megabytes:g}", args.merge_files, megabytes, config)
                print(f"  {args.merge_files} x {megabytes:g} MB, rankstream merge alone: {wall:.1f} s, {rss:.0f} MB peak")
                shutil.rmtree(root / f"memory{megabytes:g}")
        if "hta" not in skip:
            row = hta_round(root, args.hta_events, config)
            print(f"== HTA: {row['events']:,} Kineto events over 2 ranks")
            if row.get("hta_s"):
                print(f"  HTA load + temporal breakdown {row['hta_s']:.1f} s / {row['hta_mb']:.0f} MB "
                      f"({' '.join(row['hta_detail'])}); {row['events'] / row['hta_s']:,.0f} events/s")
            else:
                print(f"  HTA not measured: {' '.join(row['hta_detail'])}")
            print(f"  rankstream import + merge/steps/breakdown {row['rankstream_s']:.1f} s (import {row['import_s']:.1f}, "
                  f"analyses {row['analysis_s']:.1f}), peak RSS {row['rankstream_mb']:.0f} MB per command, "
                  f"materializer {row['materializer_mb']:.0f} MB; "
                  + (f"speedup {row['hta_s'] / row['rankstream_s']:.1f}x" if row.get("hta_s") else ""))
        if "materialized" not in skip:
            row = materialized_round(root, args.events)
            analysis = row["steps"] + row["breakdown"]
            print(f"== on data already in DuckDB: {row['events']:,} events, 8 ranks")
            print(f"  clock alignment {row['clocks']:.2f} s, step analysis {row['steps']:.2f} s, temporal breakdown + op stats "
                  f"{row['breakdown']:.2f} s: steps + breakdown {analysis:.2f} s (target 2 s), "
                  f"{row['events'] / analysis:,.0f} events/s")
            print(f"  as one command (rankstream analyze run --only clocks,steps,breakdown, startup included): "
                  f"{row['command_s']:.2f} s")
    finally:
        down(config)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
