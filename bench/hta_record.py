#!/usr/bin/env python3
"""Record what Holistic Trace Analysis (HTA) 0.5.0 computes on every GPU trace directory, as JSON.

rankstream's GPU analyses must agree with HTA column by column; this script produces the
reference figures (``tests/data/hta_expected.json``) that rankstream's tests compare against.
It runs in a virtualenv of its own, never in the project's ``.venv``; HTA's metadata requires
jupyterlab and pytest, which it does not use, so it is installed with --no-deps plus the packages it
imports:

    python3 -m venv /work/hta-venv
    /work/hta-venv/bin/pip install --no-deps HolisticTraceAnalysis==0.5.0
    /work/hta-venv/bin/pip install "pandas>=2.2,<3" "numpy<2.3" plotly networkx pydot ijson pyyaml psutil

(pandas < 3: HTA 0.5.0 predates pandas 3 and its copy-on-write/string-dtype changes; the
figures in the JSON were recorded with pandas 2.3.3 and numpy 2.2.6. torch is not needed.)

Run from the repository root:

    /work/hta-venv/bin/python bench/hta_record.py                       # defaults below
    /work/hta-venv/bin/python bench/hta_record.py --root /work/shared/traces/gpu \\
        --out tests/data/hta_expected.json

For every directory under ``--root`` that directly holds trace files (``*.json`` / ``*.gz``, the
files HTA itself picks up), the script runs ``TraceAnalysis(trace_dir=...)`` and then, with
HTA's DEFAULT arguments (only ``visualize=False`` is passed where the API has it: plotting does not
change the numbers, except that ``get_idle_time_breakdown(visualize=True)`` turns its ``stream``
column into strings):

* ``get_temporal_breakdown()``
* ``get_comm_comp_overlap()``
* ``get_gpu_kernel_breakdown()`` -> ``kernel_type_breakdown`` and ``kernel_breakdown``
* ``get_idle_time_breakdown()``          (default ranks = [0])
* ``get_queue_length_summary()``         (default ranks = [0])
* ``get_cuda_kernel_launch_stats()``     (default ranks = [0])
* ``get_memory_bw_summary()``            (default ranks = [0])

The four rank-parameterised analyses only look at rank 0 by default and raise ``ValueError``
(from ``Trace.get_trace``) when the trace has no rank 0; whenever a directory's ranks are not
exactly [0] they are also recorded with ``ranks=<all its ranks>`` under ``<name>@all_ranks``.
A failure is recorded as ``{"error": "Type: message", "where": "<deepest hta/ frame>",
"raised_in": "<deepest frame, if outside hta>"}`` and never stops the run; a directory HTA cannot
load gets ``load_error`` instead of ``results``.

Besides the real traces, small synthetic multi-rank sets made by ``bench/kineto_gpu_generator.py``
are recorded under ``generated/<name>`` (``--no-generated`` to skip); their entry holds the
generator arguments and the sha256 of each file's JSON text (decompressed for .gz), so a test can
regenerate identical traces.

Each entry also has: ``files`` (name, bytes), ``ranks`` (rank -> file as HTA mapped it),
``load`` facts (events kept per rank, GPU events per rank, whether the last-profiler-step filter
ran), and ``wall_s`` (load, each analysis, and ``load+core`` = load + temporal + overlap + kernel
breakdown), measured on the machine in ``environment``.

Tables are stored as ``{"columns": [...], "rows": [[...], ...]}`` in HTA's row order; NaN is
``null``, +-inf is the string ``"inf"``/``"-inf"``, integral floats are written as integers, other
floats are rounded to ``--sig`` significant digits (default 9).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import platform
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOT = "/work/shared/traces/gpu"
DEFAULT_OUT = "tests/data/hta_expected.json"
# name -> generator arguments (see bench/kineto_gpu_generator.py). Seeds chosen so that no two
# kernels have equal total time at the per-kernel table's top-k cut, where HTA's unstable sort
# would pick one arbitrarily.
DEFAULT_GENERATED = {
    "2rank_json": {"ranks": 2, "steps": 6, "kernels_per_step": 120, "seed": 1, "compress": False},
    "4rank_gz": {"ranks": 4, "steps": 4, "kernels_per_step": 60, "seed": 3, "compress": True},
}
RANK_ANALYSES = ("idle_time_breakdown", "queue_length_summary", "cuda_kernel_launch_stats", "memory_bw_summary")

SIG = 9


# ---------------------------------------------------------------------------------------------
# JSON conversion
# ---------------------------------------------------------------------------------------------
def num(x: Any) -> Any:
    """A JSON-safe scalar: NaN -> None, inf -> "inf", integral float -> int, else rounded float."""
    try:
        import numpy as np  # noqa: F401  (only to recognise numpy scalars)
        if isinstance(x, np.generic):
            x = x.item()
    except ImportError:  # pragma: no cover
        pass
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if x.is_integer() and abs(x) < 2 ** 53:
            return int(x)
        return float("%.*g" % (SIG, x))
    try:  # pandas NA / NaT and friends
        import pandas as pd
        if pd.isna(x):
            return None
    except Exception:
        pass
    return str(x)


def table(df, columns: Optional[List[str]] = None) -> Dict[str, Any]:
    """DataFrame -> {"columns", "rows"}; index levels become leading columns, MultiIndex columns
    are flattened to their last non-empty level (describe(): count, mean, std, min, 25%, ...)."""
    import pandas as pd

    if df is None:
        return {"value": None}
    df = df.copy()
    if isinstance(df.index, pd.MultiIndex) or any(n is not None for n in df.index.names):
        df = df.reset_index()  # describe() tables: (rank, stream|name) index -> leading columns
    else:
        df = df.reset_index(drop=True)  # a plain positional index carries no information
    cols = []
    for c in df.columns:
        if isinstance(c, tuple):
            parts = [str(p) for p in c if str(p) != ""]
            cols.append(parts[-1] if parts else "")
        else:
            cols.append(str(c))
    df.columns = cols
    if columns is not None:
        df = df[[c for c in columns if c in df.columns]]
    return {"columns": list(df.columns), "rows": [[num(v) for v in row] for row in df.itertuples(index=False, name=None)]}


def _frame(fr) -> str:
    fn = fr.filename
    i = fn.find("site-packages/")
    return "%s:%s:%d" % (fn[i + len("site-packages/"):] if i >= 0 else os.path.basename(fn), fr.name, fr.lineno)


def error_entry(exc: BaseException) -> Dict[str, str]:
    """{"error": "Type: message", "where": deepest HTA frame[, "raised_in": deepest frame]}"""
    tb = traceback.extract_tb(exc.__traceback__)
    out = {"error": "%s: %s" % (type(exc).__name__, exc)}
    hta_frames = [fr for fr in tb if "/hta/" in fr.filename]
    if hta_frames:
        out["where"] = _frame(hta_frames[-1])
    if tb and (not hta_frames or tb[-1] is not hta_frames[-1]):
        out["raised_in"] = _frame(tb[-1])
    return out


def dumps_compact(obj: Any, indent: int = 0) -> str:
    """JSON with dicts indented, scalar lists inline, and lists of rows one row per line."""
    pad = " " * indent
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        if len(obj) <= 8 and all(not isinstance(v, (dict, list)) for v in obj.values()):
            return json.dumps(obj, separators=(", ", ": "))
        items = ['%s %s: %s' % (pad, json.dumps(k), dumps_compact(v, indent + 1)) for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list):
        if all(not isinstance(v, (dict, list)) for v in obj):
            return json.dumps(obj, separators=(",", ":"))
        if all(isinstance(v, list) and all(not isinstance(w, (dict, list)) for w in v) for v in obj):
            return "[\n" + ",\n".join(pad + " " + json.dumps(v, separators=(",", ":")) for v in obj) + "\n" + pad + "]"
        return "[\n" + ",\n".join(pad + " " + dumps_compact(v, indent + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj)


# ---------------------------------------------------------------------------------------------
# HTA runs
# ---------------------------------------------------------------------------------------------
def find_trace_dirs(root: Path) -> List[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if any(f.endswith(".json") or f.endswith(".gz") for f in filenames):
            out.append(Path(dirpath))
    return sorted(out)


def timed(fn: Callable[[], Any]) -> Tuple[Any, Optional[BaseException], float]:
    t0 = time.perf_counter()
    try:
        res = fn()
        return res, None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - HTA raises all sorts
        return None, e, time.perf_counter() - t0


def record_dir(trace_dir: Path) -> Dict[str, Any]:
    from hta.trace_analysis import TraceAnalysis

    entry: Dict[str, Any] = {}
    files = sorted(f for f in os.listdir(trace_dir) if f.endswith(".json") or f.endswith(".gz"))
    entry["files"] = [{"name": f, "bytes": (trace_dir / f).stat().st_size} for f in files]
    wall: Dict[str, float] = {}
    ta, err, dt = timed(lambda: TraceAnalysis(trace_dir=str(trace_dir)))
    wall["load"] = round(dt, 4)
    if err is not None:
        entry["load_error"] = error_entry(err)
        entry["wall_s"] = wall
        return entry
    t = ta.t
    ranks = t.get_ranks()
    sym = t.symbol_table.get_sym_id_map()
    step_syms = sorted(k for k in sym if "ProfilerStep" in k)
    entry["ranks"] = {str(r): os.path.basename(t.trace_files[r]) for r in ranks}
    entry["load"] = {
        "profiler_step_symbols": len(step_syms),
        "last_step_filter_applied": len(step_syms) >= 2,
        "events_kept": {str(r): int(len(t.traces[r])) for r in ranks},
        "gpu_events_kept": {str(r): int((t.traces[r]["stream"] != -1).sum()) for r in ranks},
    }
    res: Dict[str, Any] = {}

    def run(name: str, fn: Callable[[], Any], conv: Callable[[Any], Any]) -> None:
        out, e, d = timed(fn)
        wall[name] = round(d, 4)
        if e is not None:
            res[name] = error_entry(e)
            return
        try:
            res[name] = conv(out)
        except Exception as e2:  # noqa: BLE001
            res[name] = error_entry(e2)

    run("temporal_breakdown", lambda: ta.get_temporal_breakdown(visualize=False), table)
    run("comm_comp_overlap", lambda: ta.get_comm_comp_overlap(visualize=False), table)

    def conv_kb(out):
        kt, kd = out
        res["kernel_type_breakdown"] = table(kt)
        return table(kd, ["kernel_type", "name", "rank", "sum (us)", "mean (us)", "max (us)", "min (us)", "stddev"])

    run("kernel_breakdown", lambda: ta.get_gpu_kernel_breakdown(visualize=False), conv_kb)
    # keep kernel_type_breakdown next to kernel_breakdown, errors included
    if "kernel_type_breakdown" not in res and "error" in res.get("kernel_breakdown", {}):
        res["kernel_type_breakdown"] = res["kernel_breakdown"]
    wall["load+core"] = round(wall["load"] + wall["temporal_breakdown"] + wall["comm_comp_overlap"]
                              + wall["kernel_breakdown"], 4)

    def conv_launch(out):
        return {str(r): table(df) for r, df in out.items()}

    def rank_analyses(suffix: str, rk: Optional[List[int]]) -> None:
        kw = {} if rk is None else {"ranks": rk}
        run("idle_time_breakdown" + suffix, lambda: ta.get_idle_time_breakdown(visualize=False, **kw)[0], table)
        run("queue_length_summary" + suffix, lambda: ta.get_queue_length_summary(**kw), table)
        run("cuda_kernel_launch_stats" + suffix, lambda: ta.get_cuda_kernel_launch_stats(visualize=False, **kw),
            conv_launch)
        run("memory_bw_summary" + suffix, lambda: ta.get_memory_bw_summary(**kw), table)

    rank_analyses("", None)
    if ranks != [0]:
        rank_analyses("@all_ranks", ranks)
    entry["results"] = res
    entry["wall_s"] = wall
    return entry


def load_generator():
    path = Path(__file__).resolve().parent / "kineto_gpu_generator.py"
    spec = importlib.util.spec_from_file_location("kineto_gpu_generator", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def _report(rel: str, seconds: float, entry: Dict[str, Any]) -> None:
    core = entry["wall_s"].get("load+core")
    tail = "load+core %.2fs" % core if core is not None else "LOAD FAILED: " + entry["load_error"]["error"]
    print("%-50s %6.2fs  %s" % (rel, seconds, tail), file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    global SIG
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=DEFAULT_ROOT, help="directory tree of trace directories (default %(default)s)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="output JSON, relative to the repo root (default %(default)s)")
    ap.add_argument("--sig", type=int, default=9, help="significant digits for non-integral floats")
    ap.add_argument("--no-generated", action="store_true", help="skip the synthetic generated/* sets")
    ap.add_argument("--only", action="append", default=[], help="record only these relative directories")
    args = ap.parse_args(argv)
    SIG = args.sig

    warnings.filterwarnings("ignore")
    import hta.trace_analysis  # noqa: F401  (importing it configures HTA's logger)
    logging.getLogger("hta").setLevel(logging.ERROR)
    import importlib.metadata as md
    import numpy
    import pandas

    root = Path(args.root).resolve()
    out_path = Path(args.out)
    if not out_path.is_absolute():
        out_path = REPO / out_path
    doc: Dict[str, Any] = {
        "hta_version": md.version("HolisticTraceAnalysis"),
        "environment": {
            "python": platform.python_version(), "pandas": pandas.__version__, "numpy": numpy.__version__,
            "cpus": os.cpu_count(), "machine": platform.machine(),
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "root": str(root),
        "call": "TraceAnalysis(trace_dir=d); analyses with default arguments and visualize=False",
        "directories": {},
    }
    for d in find_trace_dirs(root):
        rel = d.relative_to(root).as_posix()
        if args.only and rel not in args.only:
            continue
        t0 = time.perf_counter()
        doc["directories"][rel] = record_dir(d)
        _report(rel, time.perf_counter() - t0, doc["directories"][rel])
    if not args.no_generated:
        gen = load_generator()
        for name, params in DEFAULT_GENERATED.items():
            rel = "generated/" + name
            if args.only and rel not in args.only:
                continue
            with tempfile.TemporaryDirectory(prefix="hta_gen_") as tmp:
                summary = gen.generate(tmp, **params)
                t0 = time.perf_counter()
                entry = record_dir(Path(tmp))
                entry["generator"] = {"script": "bench/kineto_gpu_generator.py", "args": params,
                                      "gpu_events": summary["gpu_events"],
                                      "sha256": {f["name"]: f["sha256"] for f in summary["files"]}}
                doc["directories"][rel] = entry
                _report(rel, time.perf_counter() - t0, entry)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    text = dumps_compact(doc) + "\n"
    out_path.write_text(text)
    print("wrote %s (%d bytes)" % (out_path, len(text.encode())), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
