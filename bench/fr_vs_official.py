"""rankstream diagnose against PyTorch's Flight Recorder analyzer, on the same dump files.

For each size (ranks x entries per rank) it writes NCCL-style dumps with
``rankstream.demo.fr_dump_generator`` (default group, tensor-parallel groups of 8 with sequence-parallel
all-gather/reduce-scatter, data-parallel all-reduce; rank 5 issues a wrong op two thirds in), then
runs, as separate processes, ``python -m torch.distributed.flight_recorder.fr_trace DIR --prefix
rank_`` and ``rankstream diagnose DIR --prefix rank_ --json``, and prints each one's verdict,
culprit ranks, wall time and peak RSS (the whole process tree, sampled every 50 ms), plus
rankstream's analysis time on data already in DuckDB, and the reading floor: the CPU that
unpickling and converting a sample of the dumps takes in this process (the work
``rankstream diagnose``'s reader processes do per file, Parquet aside), times the number of dumps,
over the cores. No schedule of the reading can end sooner than that.

Usage: python bench/fr_vs_official.py [--sizes 64x2000,512x2000,2048x2000,8192x2000] [--official-max-ranks 512]
The official analyzer is skipped above ``--official-max-ranks`` (measured here: 190 s and 7.7 GB at
2048 x 2000; it cannot fit 8192 x 2000 in this machine's memory).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from measure import run_measured


def official_culprits(output: str) -> tuple[str, list[int]]:
    culprits = sorted({int(m) for m in re.findall(r"Culprit rank (\d+)", output)})
    if "Traceback" in output:
        return "crashed", culprits
    if re.search(r"has errors|mismatch", output, re.IGNORECASE):
        return "desync", culprits
    return "healthy", culprits


def materialized_analysis_s(directory: Path) -> float:
    """Seconds for the matching and findings alone, on data already loaded into DuckDB."""
    import duckdb

    from rankstream.flows.collectives import build_collective_tables, findings_for_run
    from rankstream.flows.dump_loader import load_dump_directory
    from rankstream.schemas.tables import ddl

    entries, _, _ = load_dump_directory(directory, "rank_", "bench")
    con = duckdb.connect()
    con.execute(ddl())
    con.register("_entries", entries)
    con.execute("INSERT INTO fr_entries SELECT * FROM _entries")
    del entries
    started = time.monotonic()
    build_collective_tables(con, "bench")
    findings_for_run(con, "bench")
    return time.monotonic() - started


def reading_floor_s(directory: Path, ranks: int, sample: int = 64) -> dict[str, float]:
    """CPU seconds per dump for unpickling and for the whole per-file step of the reader
    processes, measured on ``sample`` dumps; and that step for all ``ranks`` dumps over the cores."""
    import os

    from rankstream.flows.dump_loader import _load_file as load_one_dump  # a reader process's per-file step
    from rankstream.producers.fr_reader import list_fr_files, parse_dump
    from rankstream.producers.importing import paused_gc

    files = list_fr_files(directory, "rank_", None)[:sample]
    with paused_gc():  # as in the reader processes
        started = time.process_time()
        for _, path in files:
            parse_dump(path.read_bytes(), str(path))
        unpickled = time.process_time()
        for rank, path in files:
            load_one_dump(path, rank, "bench", False, False)
        loaded = time.process_time()
    per_dump = (loaded - unpickled) / len(files)
    return {"unpickle_ms": (unpickled - started) / len(files) * 1000, "per_dump_ms": per_dump * 1000,
            "floor_s": per_dump * ranks / (os.cpu_count() or 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64x2000,512x2000,2048x2000,8192x2000")
    parser.add_argument("--official-max-ranks", type=int, default=512)
    parser.add_argument("--fault", default="wrong_op")
    parser.add_argument("--fault-rank", type=int, default=5)
    args = parser.parse_args()

    from rankstream.demo.fr_dump_generator import write_dumps

    rows = []
    for size in args.sizes.split(","):
        ranks, entries = (int(part) for part in size.lower().split("x"))
        directory = Path(tempfile.mkdtemp(prefix=f"fr-{ranks}x{entries}-"))
        started = time.monotonic()
        write_dumps(directory, ranks, entries, fault=args.fault, fault_rank=args.fault_rank)
        print(f"{ranks} x {entries}: dumps written in {time.monotonic() - started:.1f} s", flush=True)
        output, wall, rss, code = run_measured([sys.executable, "-m", "rankstream", "diagnose", str(directory),
                                                "--prefix", "rank_", "--json"], timeout_s=1800)
        try:
            report = json.loads(output.strip().splitlines()[-1])
            ours = (report["verdict"], sorted({r for f in report["findings"] for r in f["culprit_ranks"]}))
        except (ValueError, IndexError, KeyError):
            ours = (f"error (exit {code})", [])
        row = {"size": f"{ranks} x {entries}", "rankstream": ours, "rankstream_s": wall, "rankstream_mb": rss,
               "analysis_only_s": materialized_analysis_s(directory), **reading_floor_s(directory, ranks)}
        if ranks <= args.official_max_ranks:
            output, wall, rss, code = run_measured([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                                                    str(directory), "--prefix", "rank_"], timeout_s=3600)
            row.update(official=official_culprits(output), official_s=wall, official_mb=rss)
        rows.append(row)
        print(json.dumps(row), flush=True)
        shutil.rmtree(directory, ignore_errors=True)  # 8,192 x 2,000 dumps take 4 GB

    print(f"\nrankstream diagnose vs torch fr_trace (fault {args.fault} on rank {args.fault_rank})")
    print(f"{'size':>14} | {'rankstream verdict':>24} {'s':>7} {'MB':>7} {'analysis s':>10} | "
          f"{'fr_trace verdict':>24} {'s':>7} {'MB':>7} | speed-up | reading floor")
    for row in rows:
        ours = f"{row['rankstream'][0]} {row['rankstream'][1]}"
        line = (f"{row['size']:>14} | {ours:>24} {row['rankstream_s']:7.1f} {row['rankstream_mb']:7.0f} "
                f"{row['analysis_only_s']:10.2f} | ")
        if "official" in row:
            theirs = f"{row['official'][0]} {row['official'][1]}"
            line += (f"{theirs:>24} {row['official_s']:7.1f} {row['official_mb']:7.0f} | "
                     f"{row['official_s'] / row['rankstream_s']:.1f}x")
        else:
            line += f"{'(not run)':>24} {'':>7} {'':>7} |         "
        line += (f" | {row['floor_s']:.1f} s ({row['per_dump_ms']:.1f} ms per dump, "
                 f"unpickling {row['unpickle_ms']:.1f})")
        print(line)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "fr_vs_official.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
