"""Builds a run's projection rows directly in a DuckDB file, with known ground truth: each rank's
clock skew, each step's phases, which rank is slow. The analyses' tests check they recover it."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from rankstream.schemas.tables import ddl

MS = 1_000_000
#: Phase spans of every step, in order, with their length in ms.
PHASES = (("data", 2), ("forward", 10), ("backward", 20), ("allreduce", 6), ("optimizer", 3))


@dataclass
class BuiltRun:
    run_id: str
    world_size: int
    steps: int
    skew_ns: dict[int, int]
    slow_rank: int | None
    slow_ns: int
    fr_bytes: dict[int, int] = field(default_factory=dict)  # per rank, collective entries' input bytes
    fr_send_bytes: dict[tuple[int, int], int] = field(default_factory=dict)


def _insert(con, table: str, rows: list[dict]) -> None:
    if rows:
        con.register("_rows", pa.Table.from_pylist(rows))
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _rows")
        con.unregister("_rows")


def build_run(db_path: Path, run_id: str = "built", world_size: int = 4, steps: int = 6, slow_rank: int | None = 2,
              slow_ns: int = 15 * MS, skew_ns: dict[int, int] | None = None, seed: int = 7,
              clock_rounds: int = 3, fr_times: bool = True, p2p: bool = True, finished: bool = False) -> BuiltRun:
    """One run: every step is data, forward, backward, all-reduce (a gloo span plus an FR entry),
    optimizer; the slow rank sleeps ``slow_ns`` before its data span, and its peers wait that long
    in the all-reduce. Rank r's clock reads ``skew_ns[r]`` ahead of true time."""
    rng = random.Random(seed)
    skew = skew_ns or {r: 0 for r in range(world_size)}
    built = BuiltRun(run_id, world_size, steps, skew, slow_rank, slow_ns)
    con = duckdb.connect(str(db_path))
    con.execute(ddl())
    events, fr, meta = [], [], []
    true_now = 1_700_000_000_000_000_000
    record = {r: 0 for r in range(world_size)}
    for step in range(steps):
        starts = {}
        for rank in range(world_size):
            t = true_now + (slow_ns if rank == slow_rank else 0)
            starts[rank] = t
        # every rank reaches the all-reduce after its own compute; it completes when the last arrives
        arrive = {r: starts[r] + sum(ms for name, ms in PHASES[:3]) * MS for r in range(world_size)}
        done = max(arrive.values()) + PHASES[3][1] * MS
        for rank in range(world_size):
            s = skew[rank]
            events.append(dict(run_id=run_id, rank=rank, name="step", cat="step", ph="i", ts_ns=true_now + s,
                               dur_ns=0, pid=100 + rank, tid=1, step=step))
            t = starts[rank]
            for name, ms in PHASES[:3]:
                if name == "data":
                    events.append(dict(run_id=run_id, rank=rank, name=name, cat="user_annotation", ph="B",
                                       ts_ns=t + s, dur_ns=0, pid=100 + rank, tid=1, step=step))
                    events.append(dict(run_id=run_id, rank=rank, name=name, cat="user_annotation", ph="E",
                                       ts_ns=t + ms * MS + s, dur_ns=0, pid=100 + rank, tid=1, step=step))
                else:
                    events.append(dict(run_id=run_id, rank=rank, name=name, cat="user_annotation", ph="X",
                                       ts_ns=t + s, dur_ns=ms * MS, pid=100 + rank, tid=1, step=step))
                    events.append(dict(run_id=run_id, rank=rank, name="aten::mm", cat="cpu_op", ph="X",
                                       ts_ns=t + s + MS, dur_ns=(ms - 2) * MS, pid=100 + rank, tid=1, step=step))
                t += ms * MS
            events.append(dict(run_id=run_id, rank=rank, name="gloo:all_reduce", cat="user_annotation", ph="X",
                               ts_ns=t + s, dur_ns=done - t, pid=100 + rank, tid=2, step=step))
            size = 1024 * (1 + rng.randint(0, 3))
            fr.append(dict(run_id=run_id, rank=rank, snapshot_ns=done + s, record_id=record[rank], pg_id=0,
                           pg_name="0", pg_desc="default_pg", collective_seq_id=step + 1, p2p_seq_id=0, op_id=step,
                           profiling_name="nccl:all_reduce", time_created_ns=t + s,
                           time_discovered_started_ns=(t + s) if fr_times else None,
                           time_discovered_completed_ns=(done + rng.randint(0, 20_000) + s) if fr_times else None,
                           input_sizes=[[size]], input_dtypes=["Float"], output_sizes=[[size]],
                           output_dtypes=["Float"], state="completed", retired=True, timeout_ms=600000,
                           is_p2p=False))
            built.fr_bytes[rank] = built.fr_bytes.get(rank, 0) + size * 4
            record[rank] += 1
            if p2p:  # ring send to the next rank (p2p entries name group-local ranks)
                peer = (rank + 1) % world_size
                fr.append(dict(run_id=run_id, rank=rank, snapshot_ns=done + s, record_id=record[rank], pg_id=0,
                               pg_name="0", pg_desc="default_pg", collective_seq_id=0, p2p_seq_id=step + 1,
                               op_id=step, profiling_name=f"nccl:send {rank}->{peer}", time_created_ns=done + s,
                               time_discovered_started_ns=done + s, time_discovered_completed_ns=done + MS + s,
                               input_sizes=[[256]], input_dtypes=["Half"], output_sizes=[[256]],
                               output_dtypes=["Half"], state="completed", retired=True, timeout_ms=600000,
                               is_p2p=True))
                built.fr_send_bytes[(rank, peer)] = built.fr_send_bytes.get((rank, peer), 0) + 256 * 2
                record[rank] += 1
            t = done
            name, ms = PHASES[4]
            events.append(dict(run_id=run_id, rank=rank, name=name, cat="user_annotation", ph="X", ts_ns=t + s,
                               dur_ns=ms * MS, pid=100 + rank, tid=1, step=step))
        true_now = done + PHASES[4][1] * MS
    # clock sync rounds: all ranks read inside the same real interval, no longer than any rank's bound
    for round_number in range(clock_rounds):
        shared = true_now + round_number * 10 * MS
        bound = rng.randint(50_000, 400_000)
        for rank in range(world_size):
            reading = shared + rng.randint(0, bound) + skew[rank]
            meta.append(dict(run_id=run_id, rank=rank, world_size=world_size, session_id=f"s{rank}",
                             sent_ns=reading, host=f"h{rank}" if skew_ns else "h", pid=100 + rank, started_at_ns=1, clock_sync_ns=reading,
                             clock_error_ns=bound + rng.randint(0, 100_000), clock_round=round_number))
    _insert(con, "trace_events", events)
    _insert(con, "fr_entries", fr)
    _insert(con, "rank_metadata", meta)
    if finished:  # every rank's final heartbeat: the run has ended
        _insert(con, "heartbeats", [dict(run_id=run_id, rank=r, session_id=f"s{r}", sent_ns=true_now + skew[r],
                                         final=True) for r in range(world_size)])
    _insert(con, "process_groups", [dict(run_id=run_id, rank=r, reported_ns=1, pg_name="0", pg_desc="default_pg",
                                         ranks=list(range(world_size)), backend="nccl") for r in range(world_size)])
    con.close()
    return built
