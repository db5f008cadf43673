"""The collective diagnosis against PyTorch's fr_trace and the reading floor, all in one run.

1. Accuracy on the generated matrix (``tests/diagnosis/fr_scenarios.py``): verdict and culprit per
   fault kind, rankstream (``diagnose_directory``) against fr_trace (``bench/fr_trace_accuracy.py``,
   whose scoring both use).
2. ``rankstream diagnose`` on 512 ranks x 2000 NCCL-style pickle entries, timed as the whole process,
   against the reading floor (one process unpickling every dump with C pickle and a ``find_class``
   that refuses every class, nothing else) and fr_trace; rounds interleaved, medians reported.
3. 8192 x 2000: rankstream's wall time and peak memory (fr_trace does not fit in this machine).
4. Live: one pass of the hang watch's diagnosis over 2048 x 2000 entries already in DuckDB.

Usage: python bench/diagnosis.py [--rounds 3] [--skip accuracy,8192,live] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measure import run_measured  # noqa: E402

PYTHON = sys.executable
FLOOR = """
import io, pickle, sys
from pathlib import Path
class Refuse(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused {module}.{name}")
for path in sorted(Path(sys.argv[1]).iterdir()):
    Refuse(io.BytesIO(path.read_bytes())).load()
"""

#: rankstream's own floor: the same files unpickled *and* converted to the diagnosis's columns, one
#: at a time in one process, each part timed; spread over every core it is the least the design can
#: take, before start-up and the diagnosis itself.
CONVERT_FLOOR = """
import gc, json, os, sys, time
from pathlib import Path
import pyarrow as pa
from rankstream.flows.diagnosis.columnar import entry_table, from_entry_tables
from rankstream.flows.diagnosis.entries import Vocabulary
from rankstream.producers.fr_reader import groups_from_pg_config, parse_dump
pa.set_cpu_count(1)
gc.disable()  # as the reader does while it holds a dump's objects (paused_gc)
vocabulary, unpickle, convert, tables = Vocabulary(), 0.0, 0.0, []
for path in sorted(Path(sys.argv[1]).iterdir()):
    raw = path.read_bytes()
    started = time.perf_counter()
    dump = parse_dump(raw, str(path))
    parsed = time.perf_counter()
    members = {g["pg_name"]: sorted(g["ranks"]) for g in groups_from_pg_config(dump.get("pg_config")) if g["ranks"]}
    tables.append(entry_table(dump["entries"]))
    if len(tables) == 32:  # in batches, as the reader converts them
        from_entry_tables(tables, [0] * len(tables), members, vocabulary=vocabulary)
        tables = []
    convert += time.perf_counter() - parsed
    unpickle += parsed - started
    del dump
if tables:
    started = time.perf_counter()
    from_entry_tables(tables, [0] * len(tables), members, vocabulary=vocabulary)
    convert += time.perf_counter() - started
print(json.dumps({"unpickle_s": unpickle, "convert_s": convert, "cores": os.cpu_count()}))
"""
STARTUP = "import rankstream.cli, rankstream.flows.diagnosis.report"


def accuracy() -> dict:
    import fr_trace_accuracy as peer

    from rankstream.flows.diagnosis.report import diagnose_directory
    from tests.diagnosis.fr_scenarios import scenarios, write_scenario

    ours = []
    with tempfile.TemporaryDirectory() as scratch:
        for case in scenarios():
            report = diagnose_directory(write_scenario(case, Path(scratch) / case.name), prefix="rank_")
            root = report.diagnosis.root
            outcome = "problem" if root else "no_problem"
            verdict, culprit = peer.score(case.expected, outcome, set(root.culprit_ranks) if root else set())
            kind_right = (root.kind if root else None) == case.expected.kind
            ours.append({"name": case.name, "kind": case.expected.kind or "healthy", "fmt": case.fmt,
                         "verdict_ok": verdict, "culprit_ok": culprit and kind_right})
    theirs = peer.run(jobs=2)
    table = {}
    for who, rows in (("rankstream", ours), ("fr_trace", theirs)):
        for row in rows:
            kind = row.get("kind") or row.get("expected_kind") or "healthy"
            cell = table.setdefault(kind, {}).setdefault(who, [0, 0, 0])
            cell[0] += bool(row.get("verdict_ok"))
            cell[1] += bool(row.get("culprit_ok"))
            cell[2] += 1
    return table


def speed(ranks: int, entries: int, rounds: int, official: bool) -> dict:
    from rankstream.demo.fr_dump_generator import write_dumps

    out: dict[str, list] = {"floor": [], "rankstream": [], "rankstream_mb": [], "fr_trace": [], "fr_trace_mb": [],
                            "unpickle": [], "convert": [], "startup": []}
    with tempfile.TemporaryDirectory() as scratch:
        directory = write_dumps(Path(scratch) / "dumps", ranks, entries, fault="wrong_op", fault_rank=5)
        for _ in range(rounds):
            _, seconds, _, code = run_measured([PYTHON, "-c", FLOOR, str(directory)], timeout_s=3600)
            out["floor"].append(seconds)
            if official:
                text, _, _, _ = run_measured([PYTHON, "-c", CONVERT_FLOOR, str(directory)], timeout_s=3600)
                parts = json.loads(text.strip().splitlines()[-1])
                out["unpickle"].append(parts["unpickle_s"])
                out["convert"].append(parts["convert_s"])
                out["cores"] = [parts["cores"]]
                out["startup"].append(run_measured([PYTHON, "-c", STARTUP], timeout_s=600)[1])
            text, seconds, peak, code = run_measured(
                [PYTHON, "-m", "rankstream", "diagnose", str(directory), "-p", "rank_", "--json"], timeout_s=3600)
            assert code == 1 and '"culprit_ranks": [5]' in text, text[-500:]
            out["rankstream"].append(seconds)
            out["rankstream_mb"].append(peak)
            if official:
                _, seconds, peak, _ = run_measured([PYTHON, "-m", "torch.distributed.flight_recorder.fr_trace",
                                                    str(directory), "--prefix", "rank_"], timeout_s=3600)
                out["fr_trace"].append(seconds)
                out["fr_trace_mb"].append(peak)
    return {key: statistics.median(values) for key, values in out.items() if values}


def live_pass(ranks: int, entries: int) -> dict:
    """Seconds of the hang watch's diagnosis of one run of ``ranks`` x ``entries`` in DuckDB."""
    import duckdb

    from rankstream.consumers.query import Database
    from rankstream.consumers.store import apply_schema, insert_arrow
    from rankstream.demo.fr_dump_generator import write_dumps
    from rankstream.flows.diagnosis.report import diagnose_stored
    from rankstream.producers.fr_reader import entry_from_dump, parse_dump
    import pyarrow as pa
    from rankstream.schemas.tables import FR_ENTRIES

    with tempfile.TemporaryDirectory() as scratch:  # the fault recent: what a live pass judges
        directory = write_dumps(Path(scratch) / "dumps", ranks, entries, fault="wrong_op", fault_rank=5, fault_at=0.9)
        con = duckdb.connect(str(Path(scratch) / "live.duckdb"))
        apply_schema(con)
        schema = pa.schema([f for f in FR_ENTRIES.arrow_schema() if not FR_ENTRIES.column(f.name).derived])
        for rank in range(ranks):
            dump = parse_dump((directory / f"rank_{rank}").read_bytes(), "dump")
            rows = [{"run_id": "live", "rank": rank, "snapshot_ns": 2**62, **entry_from_dump(e)} for e in dump["entries"]]
            insert_arrow(con, "fr_entries", pa.Table.from_pylist(rows, schema=schema))
        con.execute("CHECKPOINT")
        database = Database.over(con, "live")
        from rankstream.flows.hang_watch import TAIL_RECORDS

        diagnose_stored(database, "live", live=True, tail=TAIL_RECORDS)  # warm: the file's blocks in DuckDB's cache
        times = []
        for _ in range(3):
            started = time.perf_counter()
            report = diagnose_stored(database, "live", live=True, tail=TAIL_RECORDS)
            times.append(time.perf_counter() - started)
        assert report.findings[0].culprit_ranks == [5], report.root_cause
    return {"pass_s": statistics.median(times), "read_s": report.seconds["read"],
            "diagnose_s": report.seconds["diagnose"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    results: dict = {}
    if "accuracy" not in skip:
        results["accuracy"] = accuracy()
        print("accuracy on the generated matrix (verdicts right / culprits right / cases):")
        for kind, cells in sorted(results["accuracy"].items()):
            line = "  ".join(f"{who} {v}/{c}/{n}" for who, (v, c, n) in sorted(cells.items()))
            print(f"  {kind:22s} {line}")
    if "512" not in skip:
        results["512x2000"] = s = speed(512, 2000, args.rounds, official=True)
        print(f"512 x 2000: floor {s['floor']:.2f} s, rankstream {s['rankstream']:.2f} s "
              f"({s['rankstream'] / s['floor']:.2f}x the floor; target 1.25x), {s['rankstream_mb']:.0f} MB; "
              f"fr_trace {s['fr_trace']:.1f} s ({s['fr_trace'] / s['rankstream']:.1f}x slower), "
              f"{s['fr_trace_mb']:.0f} MB")
        own = (s["unpickle"] + s["convert"]) / s["cores"] + s["startup"]
        print(f"  rankstream's own floor: (unpickle {s['unpickle']:.2f} s + conversion to columns {s['convert']:.2f} s) "
              f"/ {s['cores']:.0f} cores + start-up {s['startup']:.2f} s = {own:.2f} s = {own / s['floor']:.2f}x the "
              f"reading floor, before the diagnosis itself")
    if "8192" not in skip:
        results["8192x2000"] = s = speed(8192, 2000, 1, official=False)
        print(f"8192 x 2000: floor {s['floor']:.1f} s, rankstream {s['rankstream']:.1f} s "
              f"({s['rankstream'] / s['floor']:.2f}x), peak {s['rankstream_mb']:.0f} MB (target 2048 MB)")
    if "live" not in skip:
        results["live_2048x2000"] = s = live_pass(2048, 2000)
        print(f"live pass over 2048 x 2000 entries in DuckDB: {s['pass_s']:.2f} s (read {s['read_s']:.2f} s, "
              f"diagnose {s['diagnose_s']:.2f} s; target 1 s)")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
