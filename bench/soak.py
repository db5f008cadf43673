"""Reliability figures under faults (issue 6), printed in one run.

1. **Broker down for a whole training run.** A 2-rank gloo job (the overhead benchmark's model)
   with rankstream on (spans every step, the Flight Recorder tap, heartbeats) but its broker
   unreachable, against the same job without rankstream: step time ratio, the producer's peak
   memory, spool bytes against the spool cap, and events emitted / spooled / dropped. Then a broker
   and a materializer start, the same ranks come back (a restarted rank resends its previous
   process's spool) and the spooled events arrive: how many, and how long it took.
2. **Materializer crashes.** A 400k-event backlog on the real broker; the materializer is
   SIGKILLed ``--kills`` times at random moments (one during ``--rebuild``), then run to the end:
   events emitted vs stored, duplicates.

Usage: python bench/soak.py [--steps 300] [--repeats 4] [--kills 20] [--spool-mb 8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import duckdb
import torch.multiprocessing as mp

from rankstream.config import config_env, load_config
from rankstream.deploy.services import down, up

WARMUP_STEPS = 20


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train(rank: int, world: int, port: int, streaming: bool, steps: int, out: str, env: dict) -> None:
    """One rank: the demo model, spans around the phases when ``streaming``."""
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import contextlib

    import torch
    import torch.distributed as dist

    import rankstream

    session = rankstream.init(run_id="soak-broker-down", fr_interval_s=1.0) if streaming else None
    span = rankstream.span if streaming else (lambda name: contextlib.nullcontext())
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step_s = []
    for step in range(steps):
        started = time.perf_counter()
        if streaming:
            rankstream.step(step)
        with span("data"):
            inputs, targets = torch.randn(256, 256), torch.randint(0, 10, (256,))
        with span("forward"):
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        with span("backward"):
            optimizer.zero_grad()
            loss.backward()
        with span("allreduce"):
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])
            dist.all_reduce(grads)
        with span("optimizer"):
            optimizer.step()
        for index in range(40):  # user instants and counters: a busy rank's event rate
            if streaming:
                rankstream.counter("metric", {"value": float(index)})
        step_s.append(time.perf_counter() - started)
    report = {"step_s": step_s[WARMUP_STEPS:], "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if streaming:
        stats = session.producer.stats()
        report.update(emitted=stats.events_emitted, spooled=stats.events_spooled, dropped=stats.events_dropped,
                      spool_bytes=stats.spool_bytes, last_error=stats.last_error)
        rankstream.shutdown(timeout_s=5)
        stats = session.producer.stats()
        report.update(spooled=stats.events_spooled, dropped=stats.events_dropped, spool_bytes=stats.spool_bytes)
    dist.destroy_process_group()
    Path(out, f"{'on' if streaming else 'off'}-rank{rank}.json").write_text(json.dumps(report))


def resend(rank: int, env: dict) -> None:
    """The rank comes back once the broker is up: its new producer resends the spool."""
    os.environ.update(env)
    import rankstream

    rankstream.init(run_id="soak-broker-down", rank=rank, world_size=2, fr_tap=False, clock_sync=False)
    rankstream.shutdown(timeout_s=60)


def broker_down(root: Path, steps: int, spool_mb: int, repeats: int) -> dict:
    config = load_config({"db_path": root / "down.duckdb", "state_dir": root / "state", "broker_port": _free_port(),
                          "producer.spool_max_bytes": spool_mb << 20}, env={})
    env = {**config_env(config), "TORCH_FR_BUFFER_SIZE": "2000"}
    runs = {"off": [], "on": []}
    for _ in range(repeats):  # interleaved, so a slow minute of the VM hits both modes
        for mode in runs:
            mp.spawn(train, args=(2, _free_port(), mode == "on", steps, str(root), env if mode == "on" else {}),
                     nprocs=2)
            runs[mode].append([json.loads(Path(root, f"{mode}-rank{r}.json").read_text()) for r in range(2)])
    mean = {mode: statistics.mean(statistics.mean(r["step_s"]) for run in rs for r in run) for mode, rs in runs.items()}
    last = runs["on"][-1]
    everything = [r for run in runs["on"] for r in run]  # every run's ranks spool under the same run id
    spooled_before = sum(r["spooled"] for r in everything)
    started = time.monotonic()
    up(config)
    try:
        for rank in range(2):
            process = mp.get_context("spawn").Process(target=resend, args=(rank, env))
            process.start()
            process.join(120)
        from rankstream.consumers.query import connect

        database = connect(config.db_path)
        arrived = 0
        while time.monotonic() - started < 120:
            arrived = database.fetchall("SELECT count(*) FROM trace_events WHERE run_id = 'soak-broker-down'")[0][0]
            if arrived >= spooled_before:
                break
            time.sleep(0.5)
        drained_s = time.monotonic() - started
    finally:
        down(config)
    return {"off_ms": mean["off"] * 1000, "on_ms": mean["on"] * 1000, "ratio": mean["on"] / mean["off"],
            "emitted": sum(r["emitted"] for r in everything), "spooled": spooled_before,
            "dropped": sum(r["dropped"] for r in everything), "spool_mb": max(r["spool_bytes"] for r in last) / 2**20,
            "spool_cap_mb": spool_mb, "rss_on_mb": max(r["rss_mb"] for r in last),
            "rss_off_mb": max(r["rss_mb"] for r in runs["off"][-1]), "arrived": arrived, "drained_s": drained_s,
            "last_error": last[0]["last_error"]}


def materializer_crashes(root: Path, kills: int) -> dict:
    from rankstream.deploy.broker import start_broker, stop_broker
    from rankstream.producers import Producer
    from rankstream.synthetic import SyntheticJob, run_synthetic_rank

    config = load_config({"db_path": root / "crash.duckdb", "state_dir": root / "cstate", "broker_port": _free_port(),
                          "partitions": 4}, env={})
    start_broker(config)
    try:
        job = SyntheticJob("crashy", world_size=4, steps=100, events_per_step=1000)
        emitted = 0
        for rank in range(job.world_size):
            producer = Producer(run_id=job.run_id, rank=rank, world_size=job.world_size, config=config)
            emitted += run_synthetic_rank(job, rank, producer)
            producer.close(timeout_s=60)
        env = {**os.environ, **config_env(config)}
        command = [sys.executable, "-m", "rankstream", "consume", "--no-serve-sql", "--max-messages", "1"]
        rng = random.Random(7)
        for round_number in range(kills):
            extra = ["--rebuild"] if round_number == kills // 2 else []
            process = subprocess.Popen(command + extra, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.8, 2.5))
            process.send_signal(signal.SIGKILL)
            process.wait(10)
        started = time.monotonic()
        subprocess.run(command + ["--once"], env=env, capture_output=True, timeout=600, check=True)
        recovered_s = time.monotonic() - started
        con = duckdb.connect(str(config.db_path), read_only=True)
        stored = con.execute("SELECT count(*) FROM trace_events").fetchall()[0][0]
        repeats = con.execute("SELECT count(*) - count(DISTINCT (run_id, rank, stream, session_id, seq)) "
                              "FROM ingested_batches").fetchall()[0][0]
        con.close()
    finally:
        stop_broker(config)
    return {"kills": kills, "emitted": emitted, "stored": stored, "repeats": repeats, "final_catch_up_s": recovered_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--spool-mb", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=4, help="runs per mode (step times vary ~10%% run to run)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rankstream-soak-"))
    row = broker_down(root, args.steps, args.spool_mb, args.repeats)
    print(f"== broker down for a whole 2-rank gloo run ({args.repeats} x {args.steps} steps per mode, interleaved; "
          "spans + counters + FR tap)")
    print(f"  step time: without rankstream {row['off_ms']:.2f} ms, with rankstream and no broker {row['on_ms']:.2f} ms "
          f"-> {100 * (row['ratio'] - 1):+.1f}% (target within 5%)")
    print(f"  events emitted (all runs) {row['emitted']:,}, spooled {row['spooled']:,}, dropped {row['dropped']:,}; spool "
          f"{row['spool_mb']:.1f} MB of its {row['spool_cap_mb']} MB cap; peak RSS {row['rss_on_mb']:.0f} MB "
          f"vs {row['rss_off_mb']:.0f} MB without rankstream")
    print(f"  producer last_error: {row['last_error']}")
    print(f"  broker back: {row['arrived']:,} of {row['spooled']:,} spooled events in DuckDB after {row['drained_s']:.1f} s "
          "(broker + materializer start, ranks resend their spools)")
    row = materializer_crashes(root, args.kills)
    print(f"== materializer SIGKILLed {row['kills']} times mid-stream (one during --rebuild)")
    print(f"  events emitted {row['emitted']:,}, stored {row['stored']:,}, repeated batches {row['repeats']}; "
          f"final catch-up {row['final_catch_up_s']:.1f} s")


if __name__ == "__main__":
    main()
