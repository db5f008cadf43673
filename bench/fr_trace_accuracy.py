"""How often PyTorch's own Flight Recorder analyzer (fr_trace) names the right culprit.

For every scenario of ``tests/diagnosis/fr_scenarios.py`` in the ``pickle`` and ``gloo`` formats, the
dumps are written to a temporary directory and

    python -m torch.distributed.flight_recorder.fr_trace DIR --prefix rank_

runs on them (its default options, one process per scenario, a timeout). fr_trace reads pickles
only, so the ``json`` scenarios count as "cannot read" without running it.

One fixed rule classifies what fr_trace printed (``classify_fr_trace``):

1. **crash**: it timed out, or exited non-zero (every such exit here ends in a Python traceback,
   including fr_trace's own ``AssertionError: Missing dump files from ranks {...}``, which is
   raised when a dump is missing and ``--allow-incomplete-ranks`` is not given; the ranks it names
   are kept in the note but a crash is never a verdict).
2. **problem**: exit 0 and at least one problem report: ``Not all ranks joining collective``,
   ``... has errors``, ``Input/output mismatch``, ``We cannot decide what's wrong ... missed FR
   dumps from ranks``, ``Too many mismatches`` or a ``MISMATCH`` table. The ranks it blames are the
   union over all reports of the ``missing ranks: {..}`` sets, the ``Culprit rank N`` names and the
   ranks it says it has no dumps of.
3. **no problem**: exit 0 and none of the above (``No errors found for this collective entry``
   alone is not a problem report: fr_trace says it found nothing wrong).

Scoring (``score``, shared with any other tool's table): the verdict is right when a problem is
expected and the tool reports one, or the case is healthy and it reports none; a crash or "cannot
read" is never right. The culprit is right when the verdict is right and the blamed set equals the
expected culprits exactly (healthy: nothing blamed).

Usage: python bench/fr_trace_accuracy.py [--out results.json] [--jobs N] [--timeout S] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_scenarios():
    path = ROOT / "tests" / "diagnosis" / "fr_scenarios.py"
    spec = importlib.util.spec_from_file_location("fr_scenarios", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fr_scenarios"] = module
    spec.loader.exec_module(module)
    return module


fr_scenarios = _load_scenarios()

__all__ = ["classify_fr_trace", "score", "score_fr_trace", "render_table", "run"]

_PROBLEM = re.compile(
    r"Not all ranks joining collective|sequence number: \d+ has errors|Input/output mismatch"
    r"|We cannot decide what's wrong|Too many mismatches|^MISMATCH", re.MULTILINE)
_SET = r"\{([\d,\s]*)\}"


def _ints(text: str) -> set[int]:
    return {int(x) for x in re.findall(r"\d+", text)}


def classify_fr_trace(stdout: str, stderr: str, returncode: int | None) -> dict:
    """The fixed rule: {'outcome': 'crash'|'problem'|'no_problem', 'blamed': [ranks], 'first_blamed':
    [ranks of the first report], 'reports': n, 'detail': str}."""
    text = (stdout or "") + "\n" + (stderr or "")
    if returncode is None:
        return {"outcome": "crash", "blamed": [], "first_blamed": [], "reports": 0, "detail": "timed out"}
    if returncode != 0:
        last = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or [""]
        detail = last[0].strip()[:200]
        m = re.search(r"Missing dump files from ranks " + _SET, text)
        if m:
            detail = f"missing-dump assertion names {sorted(_ints(m.group(1)))}"
        return {"outcome": "crash", "blamed": [], "first_blamed": [], "reports": 0, "detail": detail}
    blamed: set[int] = set()
    first: list[int] | None = None
    reports = 0
    # split the log into reports: each starts with one of the problem headlines
    chunks = re.split(r"(?=^Not all ranks joining collective|^Collective sequence number: \d+ has errors"
                      r"|^Input/output mismatch|^We cannot decide what's wrong|^MISMATCH)", text, flags=re.MULTILINE)
    for chunk in chunks:
        if not _PROBLEM.search(chunk):
            continue
        reports += 1
        ranks: set[int] = set()
        for m in re.finditer(r"missing ranks: " + _SET, chunk):
            ranks |= _ints(m.group(1))
        for m in re.finditer(r"Culprit rank (\d+)", chunk):
            ranks.add(int(m.group(1)))
        for m in re.finditer(r"missed FR dumps from ranks \(" + _SET + r"\)", chunk):
            ranks |= _ints(m.group(1))
        blamed |= ranks
        if first is None and ranks:
            first = sorted(ranks)
    if reports == 0 and re.search(r"Too many mismatches", text):
        reports = 1
    if reports == 0:
        return {"outcome": "no_problem", "blamed": [], "first_blamed": [], "reports": 0, "detail": ""}
    return {"outcome": "problem", "blamed": sorted(blamed), "first_blamed": first or [], "reports": reports,
            "detail": f"{reports} report(s)"}


def score(expected, outcome: str, blamed) -> tuple[bool, bool]:
    """(verdict right, culprit right) for any tool: outcome is 'problem' | 'no_problem' | anything
    else (crash, cannot_read: never right)."""
    healthy = expected.kind is None
    if outcome == "problem":
        verdict = not healthy
    elif outcome == "no_problem":
        verdict = healthy
    else:
        verdict = False
    culprit = verdict and set(blamed) == set(expected.culprits)
    return verdict, culprit


def score_fr_trace(scenario, stdout: str, stderr: str, returncode: int | None) -> tuple[bool, bool, str]:
    """(verdict right, culprit right, note) for one fr_trace run on ``scenario``'s dumps."""
    c = classify_fr_trace(stdout, stderr, returncode)
    verdict, culprit = score(scenario.expected, c["outcome"], c["blamed"])
    note = c["outcome"]
    if c["outcome"] == "problem":
        note += f": blames {c['blamed']} (first report {c['first_blamed']}), expected {list(scenario.expected.culprits)}"
    elif c["detail"]:
        note += f": {c['detail']}"
    return verdict, culprit, note


def render_table(rows: list[dict], title: str) -> str:
    """Per root-cause kind: cases, cannot read, crash, no problem, problem, verdict right, culprit
    right; then per format and in total. ``rows``: dicts with kind (None = healthy), fmt, outcome
    ('cannot_read' | 'crash' | 'no_problem' | 'problem'), verdict_ok, culprit_ok."""
    def line(label, rs):
        n = len(rs)
        cnt = {o: sum(1 for r in rs if r["outcome"] == o) for o in ("cannot_read", "crash", "no_problem", "problem")}
        v = sum(1 for r in rs if r["verdict_ok"])
        c = sum(1 for r in rs if r["culprit_ok"])
        return (f"{label:<22}{n:>6}{cnt['cannot_read']:>8}{cnt['crash']:>7}{cnt['no_problem']:>9}{cnt['problem']:>9}"
                f"{v:>6}/{n:<4}{c:>6}/{n:<4}")

    out = [title, f"{'kind':<22}{'cases':>6}{'noread':>8}{'crash':>7}{'noprob':>9}{'problem':>9}{'verdict':>11}{'culprit':>11}"]
    kinds = sorted({r["kind"] or "healthy" for r in rows}, key=lambda k: (k == "healthy", k))
    for k in kinds:
        out.append(line(k, [r for r in rows if (r["kind"] or "healthy") == k]))
    out.append("-" * 84)
    for fmt in ("pickle", "json", "gloo"):
        rs = [r for r in rows if r["fmt"] == fmt]
        if rs:
            out.append(line(f"format {fmt}", rs))
    out.append(line("TOTAL", rows))
    return "\n".join(out)


def _run_one(scenario, timeout_s: float) -> dict:
    row = {"name": scenario.name, "kind": scenario.expected.kind, "fault": scenario.fault, "fmt": scenario.fmt,
           "layout": scenario.layout, "position": scenario.position, "culprit_dump": scenario.culprit_dump,
           "expected_culprits": list(scenario.expected.culprits)}
    if scenario.fmt == "json":
        row.update(outcome="cannot_read", blamed=[], verdict_ok=False, culprit_ok=False,
                   note="fr_trace reads pickles only", seconds=0.0, returncode=None)
        return row
    directory = Path(tempfile.mkdtemp(prefix="frtrace_"))
    try:
        fr_scenarios.write_scenario(scenario, directory)
        command = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(directory), "--prefix", "rank_"]
        started = time.monotonic()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
            stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            rc = None
        seconds = time.monotonic() - started
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    c = classify_fr_trace(stdout, stderr, rc)
    verdict, culprit, note = score_fr_trace(scenario, stdout, stderr, rc)
    row.update(outcome=c["outcome"], blamed=c["blamed"], first_blamed=c["first_blamed"], verdict_ok=verdict,
               culprit_ok=culprit, note=note, seconds=round(seconds, 2), returncode=rc,
               output_tail=((stdout or "") + (stderr or ""))[-1500:])
    return row


def run(only: str = "", jobs: int = 2, timeout_s: float = 600.0) -> list[dict]:
    cases = [s for s in fr_scenarios.scenarios() if only in s.name]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda s: _run_one(s, timeout_s), cases))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write per-case JSON results here")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per fr_trace run")
    parser.add_argument("--only", default="", help="run only scenarios whose name contains this")
    args = parser.parse_args(argv)
    started = time.monotonic()
    rows = run(args.only, args.jobs, args.timeout)
    for r in rows:
        mark = ("V" if r["verdict_ok"] else "-") + ("C" if r["culprit_ok"] else "-")
        print(f"{mark} {r['name']:<78} {r['note']}")
    print()
    print(render_table(rows, "fr_trace (torch.distributed.flight_recorder.fr_trace, default options)"))
    print(f"\n{len(rows)} scenarios in {time.monotonic() - started:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"tool": "fr_trace", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
