"""rankstream's GPU analyses against Holistic Trace Analysis 0.5.0, figures and speed, in one run.

For each trace directory (the real GPU traces in ../shared/traces/gpu, and a generated 8-rank
Kineto set with at least ``--gpu-events`` GPU events in all), it runs, each as a whole process:

* HTA: ``TraceAnalysis(trace_dir)`` + temporal breakdown + comm/comp overlap + kernel breakdown,
  in HTA's own virtualenv (``--hta-python``; setup in bench/hta_record.py);
* ``rankstream analyze trace FILES --json``;

then prints, per directory and rank, both tools' idle/compute/non-compute percentages and
overlap, the largest difference, and the wall-time ratio (rounds interleaved, medians). A
directory HTA cannot analyse (no GPU events) is listed with HTA's error.

Usage: python bench/hta_parity.py [--rounds 3] [--gpu-events 1000000] [--hta-python /work/hta-venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kineto_gpu_generator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared/traces/gpu"

HTA_SCRIPT = """
import json, sys, warnings
warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1])
out = {}
try:
    t = analysis.get_temporal_breakdown(visualize=False)
    out["temporal"] = {int(r["rank"]): [r["idle_time_pctg"], r["compute_time_pctg"], r["non_compute_time_pctg"]]
                       for _, r in t.iterrows()}
    o = analysis.get_comm_comp_overlap(visualize=False)
    out["overlap"] = {int(r["rank"]): (None if r["comp_comm_overlap_pctg"] != r["comp_comm_overlap_pctg"]
                                       else float(r["comp_comm_overlap_pctg"])) for _, r in o.iterrows()}
    analysis.get_gpu_kernel_breakdown(visualize=False)
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"[:120]
print(json.dumps(out))
"""


def _trace_dirs() -> list[Path]:
    found = sorted({p.parent for p in TRACES.rglob("*") if p.suffix in (".json", ".gz")})
    return [d for d in found if d.is_dir()]


def _hta(python: str, directory: Path) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run([python, "-c", HTA_SCRIPT, str(directory)], capture_output=True, text=True, timeout=7200)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        return seconds, {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:120]}
    return seconds, json.loads(done.stdout.strip().splitlines()[-1])


def _rankstream(directory: Path) -> tuple[float, dict]:
    files = sorted(p for p in directory.iterdir() if p.suffix in (".json", ".gz"))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rankstream", "analyze", "trace", *map(str, files), "--json"],
                          capture_output=True, text=True, timeout=7200)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        return seconds, {"error": done.stderr.strip()[:120]}
    data = json.loads(done.stdout)
    return seconds, {
        "temporal": {r["rank"]: [r["idle_time_pctg"], r["compute_time_pctg"], r["non_compute_time_pctg"]]
                     for r in data.get("gpu_temporal_breakdown", [])},
        "overlap": {r["rank"]: r["comp_comm_overlap_pctg"] for r in data.get("comm_comp_overlap", [])}}


def _largest_difference(hta: dict, ours: dict) -> float | None:
    gaps = []
    for rank, figures in hta.get("temporal", {}).items():
        mine = ours.get("temporal", {}).get(int(rank))
        if mine is None:
            return float("inf")
        gaps += [abs(a - b) for a, b in zip(figures, mine)]
        theirs_overlap, our_overlap = hta.get("overlap", {}).get(rank), ours.get("overlap", {}).get(int(rank))
        if theirs_overlap is not None:
            gaps.append(abs(theirs_overlap - (our_overlap if our_overlap is not None else float("inf"))))
    return max(gaps) if gaps else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gpu-events", type=int, default=1_000_000)
    parser.add_argument("--hta-python", default="/work/hta-venv/bin/python")
    args = parser.parse_args()
    if not Path(args.hta_python).is_file():
        raise SystemExit(f"HTA's interpreter {args.hta_python} does not exist: set up HTA's virtualenv as "
                         "bench/hta_record.py's docstring shows, or pass --hta-python")
    with tempfile.TemporaryDirectory(prefix="hta-parity-") as scratch:
        generated = Path(scratch) / "generated-8rank"
        steps = kineto_gpu_generator.steps_for_gpu_events(args.gpu_events, 8, 120)
        summary = kineto_gpu_generator.generate(generated, ranks=8, steps=steps, kernels_per_step=120, seed=7,
                                                compress=True)
        print(f"generated 8 ranks x {steps} steps: {summary.get('gpu_events', '?'):,} GPU events")
        print(f"{'directory':46s} {'rank':>4s} {'HTA idle/comp/non/overlap':>30s} {'rankstream':>30s} {'max diff':>8s}"
              f" {'HTA s':>7s} {'ours s':>7s} {'speedup':>7s}")
        for directory in [*_trace_dirs(), generated]:
            times = {"hta": [], "ours": []}
            for _ in range(args.rounds if directory != generated else max(1, args.rounds - 1)):
                seconds, hta = _hta(args.hta_python, directory)
                times["hta"].append(seconds)
                seconds, ours = _rankstream(directory)
                times["ours"].append(seconds)
            hta_s, ours_s = statistics.median(times["hta"]), statistics.median(times["ours"])
            name = str(directory.relative_to(TRACES)) if directory != generated else "generated 8-rank"
            gap = _largest_difference(hta, ours)
            gap_text = "-" if gap is None else f"{gap:.2f}"
            if "error" in hta:
                print(f"{name:46s} {'':>4s} {'HTA: ' + hta['error'][:25]:>30s} {str(ours.get('error', 'no GPU rows'))[:30]:>30s}"
                      f" {gap_text:>8s} {hta_s:7.2f} {ours_s:7.2f} {hta_s / ours_s:6.2f}x")
                continue
            for rank, figures in sorted(hta["temporal"].items(), key=lambda kv: int(kv[0])):
                mine = ours.get("temporal", {}).get(int(rank), [None] * 3)
                theirs_text = "/".join(f"{v:.2f}" for v in figures) + f"/{hta['overlap'].get(rank)}"
                mine_text = "/".join("-" if v is None else f"{v:.2f}" for v in mine) + \
                    f"/{_round(ours.get('overlap', {}).get(int(rank)))}"
                print(f"{name:46s} {rank:>4} {theirs_text:>30s} {mine_text:>30s} {gap_text:>8s} {hta_s:7.2f} "
                      f"{ours_s:7.2f} {hta_s / ours_s:6.2f}x")
                name = ""
    hta_start = _startup([args.hta_python, "-c", "import warnings; warnings.filterwarnings('ignore'); "
                                                 "from hta.trace_analysis import TraceAnalysis"])
    ours_start = _startup([sys.executable, "-m", "rankstream", "analyze", "trace", "--help"])
    print(f"start-up alone (interpreter, imports, command line): HTA {hta_start:.2f} s, rankstream {ours_start:.2f} s; "
          "on the small traces it is most of either tool's time")


def _startup(command: list[str], rounds: int = 3) -> float:
    """Median seconds of a process that only starts and imports (the cost every small trace pays)."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run(command, capture_output=True, timeout=600)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _round(value):
    return None if value is None else round(value, 2)


if __name__ == "__main__":
    main()
