"""The diagnosis of a hang in which every rank waits for one, at growing world sizes.

Every rank issues 200 all_reduces of the default group; the last one is started everywhere but on
rank 5, which either never started it (``not_started``) or never issued it (``skip``). Every
other rank waits for rank 5, so any step that works per waiting rank shows here as ranks squared.
Only the engine is timed (the entries are built in memory, no files are read).

Usage: python bench/diagnosis_hang_scale.py [ranks ...]   (default: 512 2048)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rankstream.flows.diagnosis.engine import diagnose  # noqa: E402
from rankstream.flows.diagnosis.entries import Vocabulary, concatenate, from_dump_entries  # noqa: E402

CALLS, CULPRIT = 200, 5


def hung_job(ranks: int, fault: str):
    vocabulary, parts = Vocabulary(), []
    members = {"0": list(range(ranks))}
    for rank in range(ranks):
        rows = []
        for seq in range(1, CALLS + 1):
            last = seq == CALLS
            if last and rank == CULPRIT and fault == "skip":
                continue
            state = ("scheduled" if rank == CULPRIT and fault == "not_started" else "started") if last else "completed"
            rows.append({"record_id": len(rows), "process_group": ("0", "default_pg"), "collective_seq_id": seq,
                         "p2p_seq_id": 0, "profiling_name": "nccl:all_reduce", "input_sizes": [[8]],
                         "output_sizes": [[8]], "input_dtypes": ["Float"], "output_dtypes": ["Float"],
                         "state": state, "time_created_ns": seq, "time_discovered_started_ns": None,
                         "time_discovered_completed_ns": None})
        parts.append(from_dump_entries(rows, rank, members, vocabulary=vocabulary))
    return concatenate(parts, vocabulary), members


def main(argv: list[str]) -> int:
    for ranks in map(int, argv or ["512", "2048"]):
        for fault in ("not_started", "skip"):
            entries, members = hung_job(ranks, fault)
            started = time.perf_counter()
            root = diagnose(entries, listed=members, dumped=list(range(ranks))).root
            seconds = time.perf_counter() - started
            print(f"{ranks} ranks, {fault}: {seconds:.2f} s, root cause {root.kind} {root.culprit_ranks}"
                  f" ({len(root.waiting_ranks)} ranks wait)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
