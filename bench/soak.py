"""Reliability figures under faults (issue 6), printed in one run.

1. **Broker down for a whole training run.** A 2-rank gloo job (the overhead benchmark's model)
   with rankstream on (spans every step, the Flight Recorder tap, heartbeats) but its broker
   unreachable, against the same job without rankstream: step time ratio (mean, and the median per
   interleaved pair of runs with its spread), step-time quantiles per mode (a pause on either rank
   shows in both, the ranks wait for each other in the all-reduce), CPU per second of each thread,
   the producer's peak memory, spool bytes against the spool cap, and events emitted / spooled /
   dropped. Then a broker
   and a materializer start, the same ranks come back (a restarted rank resends its previous
   process's spool) and the spooled events arrive: how many, and how long it took.
2. **Materializer crashes.** A 400k-event backlog on the real broker; the materializer is
   SIGKILLed ``--kills`` times at random moments (one during ``--rebuild``), then run to the end:
   events emitted vs stored, duplicates.
3. **Broker restart.** Two ranks stream while the embedded broker is SIGKILLed (losing its
   in-memory log, including a backlog the paused materializer had not read) and started again:
   emitted vs stored, repeats, and the recovery time (broker back -> every event emitted before the
   kill in DuckDB). Then again with a resend window too small for the backlog: the loss is counted.
4. **Rank SIGKILLed mid-step**, ``--rank-kills`` times: every event emitted more than 1 s before
   the kill must be in DuckDB.
5. **64-rank burst.** ``--burst-ranks`` producer processes emit as fast as they can for
   ``--burst-s`` seconds on this machine's cores: peak lag, peak memory of producers, broker and
   materializer, emitted / dropped / stored, and the catch-up time after the burst.
6. **Fuzzed messages** on the real broker and materializer process: ``--fuzz`` malformed messages
   (tests/reliability/damage.py) interleaved with a valid job: rejects, valid events stored,
   materializer crashes.

Usage: python bench/soak.py [--steps 300] [--repeats 4] [--kills 20] [--spool-mb 8] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
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

from rankstream.schemas.settings import config_env, load_config
from rankstream.services import down, up

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

    torch.set_num_threads(1)  # what torchrun sets (OMP_NUM_THREADS=1) when it starts several ranks per host

    import rankstream

    session = rankstream.init(run_id="soak-broker-down", fr_interval_s=1.0) if streaming else None
    span = rankstream.span if streaming else (lambda name: contextlib.nullcontext())
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    # The training thread alone gets its own core, as on a machine with a core per rank; threads
    # started before this line (gloo's, rankstream's) keep the whole machine. Unpinned, the two
    # training threads sometimes shared a core for a whole run (pairs of runs differed by 50%).
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step_s = []
    for step in range(steps):
        if step == WARMUP_STEPS:
            cpu_before = _thread_cpu_s()
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
    report = {"step_s": step_s[WARMUP_STEPS:], "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "thread_cpu_s": {name: cpu_s - cpu_before.get(name, 0.0) for name, cpu_s in _thread_cpu_s().items()},
              "wall_s": sum(step_s[WARMUP_STEPS:])}
    if streaming:
        stats = session.producer.stats()
        report.update(emitted=stats.events_emitted, spooled=stats.events_spooled, dropped=stats.events_dropped,
                      spool_bytes=stats.spool_bytes, last_error=stats.last_error)
        rankstream.shutdown(timeout_s=5)
        stats = session.producer.stats()
        report.update(spooled=stats.events_spooled, dropped=stats.events_dropped, spool_bytes=stats.spool_bytes)
    dist.destroy_process_group()
    Path(out, f"{'on' if streaming else 'off'}-rank{rank}.json").write_text(json.dumps(report))


def _thread_cpu_s() -> dict[str, float]:
    """CPU seconds used so far by each live Python thread of this process, by thread name."""
    import threading

    ticks = os.sysconf("SC_CLK_TCK")
    used = {}
    for thread in threading.enumerate():
        try:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used[thread.name] = used.get(thread.name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return used


#: Steps of rankstream calls timed by ``api_cost``.
API_STEPS = 2_000


def _step_calls(step: int) -> None:
    """A soak step's rankstream calls (see ``train``) around no work: a step marker, five spans, 40 counters."""
    import rankstream

    rankstream.step(step)
    for name in ("data", "forward", "backward", "allreduce", "optimizer"):
        with rankstream.span(name):
            pass
    for index in range(40):
        rankstream.counter("metric", {"value": float(index)})


def api_cost(env: dict, out: str) -> None:
    """CPU of one step's rankstream calls on the training thread in a rank whose broker is down and
    whose spool refuses, as in the runs with rankstream (timed apart: in a run, with real work
    between the calls, they cannot be told from the step)."""
    os.environ.update(env)
    import rankstream

    session = rankstream.init(run_id="soak-api-cost", rank=0, world_size=1, fr_tap=False, clock_sync=False)
    step, deadline = 0, time.monotonic() + 120
    while not session.producer.refusing and time.monotonic() < deadline:  # fill the spool first
        _step_calls(step)
        step += 1
    refusing = session.producer.refusing
    started = time.thread_time()
    for step in range(step, step + API_STEPS):
        _step_calls(step)
    cpu_us = (time.thread_time() - started) / API_STEPS * 1e6
    rankstream.shutdown(timeout_s=1)
    Path(out).write_text(json.dumps({"cpu_us": cpu_us, "refusing": refusing}))


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
    # each interleaved pair of runs gives one ratio; their spread says how far the VM's noise reaches
    # medians: a GC pause or a stolen VM slice moves a run's mean by several percent, not its median
    pairs = [statistics.mean(statistics.median(r["step_s"]) for r in on) / statistics.mean(statistics.median(r["step_s"]) for r in off)
             for on, off in zip(runs["on"], runs["off"])]
    spread = 2 * statistics.stdev(pairs) / len(pairs) ** 0.5 if len(pairs) > 1 else float("nan")
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
    quantiles = {mode: _quantiles_ms([s for run in rs for r in run for s in r["step_s"]]) for mode, rs in runs.items()}
    small_spool = load_config({"db_path": root / "api.duckdb", "state_dir": root / "api-state",
                               "broker_port": _free_port(), "producer.spool_max_bytes": 1 << 20}, env={})
    process = mp.get_context("spawn").Process(target=api_cost, args=(config_env(small_spool), str(root / "api.json")))
    process.start()
    process.join(300)
    api = json.loads(Path(root, "api.json").read_text())
    return {"off_ms": mean["off"] * 1000, "on_ms": mean["on"] * 1000, "ratio": mean["on"] / mean["off"],
            "quantiles": quantiles,
            "pair_ratio": statistics.mean(pairs), "pair_spread": spread, "pairs": pairs,
            "emitted": sum(r["emitted"] for r in everything), "spooled": spooled_before,
            "dropped": sum(r["dropped"] for r in everything), "spool_mb": max(r["spool_bytes"] for r in last) / 2**20,
            "spool_cap_mb": spool_mb, "rss_on_mb": max(r["rss_mb"] for r in last),
            "rss_off_mb": max(r["rss_mb"] for r in runs["off"][-1]), "arrived": arrived, "drained_s": drained_s,
            "last_error": last[0]["last_error"], "cpu_ms_per_s": _cpu_per_second(runs["on"]),
            "api_us_per_step": api["cpu_us"], "api_refusing": api["refusing"]}


def _quantiles_ms(step_s: list[float]) -> dict[str, float]:
    ordered = sorted(step_s)
    return {name: 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]
            for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999), ("max", 1.0))}


def _cpu_per_second(runs: list[list[dict]]) -> dict[str, float]:
    """CPU ms per second of training (after warm-up) of each thread of a rank, over all runs."""
    wall = sum(r["wall_s"] for run in runs for r in run)
    used: dict[str, float] = {}
    for report in (r for run in runs for r in run):
        for name, cpu_s in report["thread_cpu_s"].items():
            name = re.sub(r"\d+", "N", name)  # the same thread in every rank and run
            used[name] = used.get(name, 0.0) + cpu_s
    return {name: 1000 * cpu_s / wall for name, cpu_s in sorted(used.items(), key=lambda item: -item[1])}


def materializer_crashes(root: Path, kills: int) -> dict:
    from rankstream.deploy.broker import stop_broker
    from rankstream.services import start_embedded_broker
    from rankstream.producers.producer import Producer
    from rankstream.demo.synthetic import SyntheticJob, run_synthetic_rank

    config = load_config({"db_path": root / "crash.duckdb", "state_dir": root / "cstate", "broker_port": _free_port(),
                          "partitions": 4}, env={})
    start_embedded_broker(config)
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


def _wait_until(condition, timeout_s: float, every_s: float = 0.2) -> float | None:
    """Seconds until ``condition()`` held, or None at the timeout."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if condition():
            return time.monotonic() - started
        time.sleep(every_s)
    return None


def _materializer_status(config) -> dict:
    try:
        return json.loads((config.state_dir / "materializer.json").read_text())
    except (OSError, ValueError):
        return {}


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _query(config, sql: str, params=()):
    from rankstream.consumers.query import connect

    return connect(config.db_path).fetchall(sql, list(params))


def broker_restart(root: Path, name: str, window_bytes: int | None, outage_s: float) -> dict:
    """Two paced ranks; pause the materializer, SIGKILL the broker, start it again, resume."""
    import threading

    from rankstream.deploy.broker import broker_status
    from rankstream.services import start_embedded_broker
    from rankstream.services import materializer_pid
    from rankstream.producers.producer import Producer
    from rankstream.status import RUNS_SQL

    overrides = {"db_path": root / f"{name}.duckdb", "state_dir": root / f"{name}-state", "broker_port": _free_port(),
                 "partitions": 4, "producer.broker_check_s": 0.5}
    if window_bytes is not None:
        overrides["producer.resend_window_bytes"] = window_bytes
    config = load_config(overrides, env={})
    up(config)
    steps, per_step = 200, 500
    producers = [Producer(run_id=name, rank=r, world_size=2, config=config) for r in range(2)]
    done_steps = [0, 0]

    def rank(number: int) -> None:
        for step in range(steps):
            for index in range(per_step):
                producers[number].emit("op", "cpu_op", "X", ts_ns=time.time_ns(), dur_ns=1000, pid=number, tid=1,
                                       step=step, flow_id=None, correlation_id=index)
            done_steps[number] = step + 1
            time.sleep(0.04)

    threads = [threading.Thread(target=rank, args=(n,)) for n in range(2)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(2.0)
        materializer = materializer_pid(config)
        os.kill(materializer, signal.SIGSTOP)  # acknowledged from now on, but not consumed
        time.sleep(1.5)
        steps_before_kill = min(done_steps)  # steps 0..this-1 were emitted by both ranks before the kill
        os.kill(broker_status(config).pid, signal.SIGKILL)
        time.sleep(outage_s)
        start_embedded_broker(config)
        back = time.monotonic()
        os.kill(materializer, signal.SIGCONT)
        sql = "SELECT count(*) FROM trace_events WHERE run_id = ? AND step < ?"
        recovered = _wait_until(lambda: _query(config, sql, [name, steps_before_kill])[0][0]
                                >= 2 * per_step * steps_before_kill, 30, 0.1)
        recovery_s = None if recovered is None else time.monotonic() - back
        for thread in threads:
            thread.join()
        stats = [p.close(timeout_s=60) for p in producers]
        total = 2 * steps * per_step
        _wait_until(lambda: _materializer_status(config).get("events", 0) >= total
                    and _materializer_status(config).get("lag_messages") == 0, 60, 0.5)
        time.sleep(2.5)  # one more status period: the final heartbeats are committed too
        stored, repeats = _query(config, "SELECT (SELECT count(*) FROM trace_events), (SELECT count(*) - "
                                 "count(DISTINCT (run_id, rank, stream, session_id, seq)) FROM ingested_batches)")[0]
        from rankstream.consumers.query import connect

        run = connect(config.db_path).arrow(RUNS_SQL).to_pylist()[0]
    finally:
        down(config)
    return {"emitted": total, "stored": stored, "repeats": repeats,
            "recovery_s": recovery_s, "resets": min(s.broker_resets for s in stats),
            "resent": sum(s.events_resent for s in stats), "not_resent": run["not_resent"],
            "missing_messages": run["missing_messages"], "status_resets": run["broker_resets"]}


def rank_child(run_id: str, progress: str) -> None:
    """A rank that streams until it is SIGKILLed, writing (time, events emitted) every 50 ms."""
    import rankstream

    session = rankstream.init(run_id=run_id, rank=0, world_size=1, fr_tap=False, clock_sync=False)
    with open(progress, "a") as out:
        step, last = 0, 0.0
        while True:
            rankstream.step(step)
            with rankstream.span("forward"):
                for index in range(200):
                    rankstream.counter("metric", {"value": float(index)})
            step += 1
            time.sleep(0.005)
            if time.monotonic() - last >= 0.05:
                last = time.monotonic()
                out.write(f"{time.time()} {session.producer.stats().events_emitted}\n")
                out.flush()


def rank_kills(root: Path, kills: int) -> dict:
    config = load_config({"db_path": root / "kills.duckdb", "state_dir": root / "kstate", "broker_port": _free_port()},
                         env={})
    up(config)
    rng = random.Random(11)
    rounds = []
    try:
        env = {**os.environ, **config_env(config)}
        for number in range(kills):
            run_id, progress = f"killed-{number}", root / f"progress-{number}.txt"
            child = subprocess.Popen([sys.executable, __file__, "--rank-child", run_id, str(progress)], env=env)
            _wait_until(lambda: progress.exists() and progress.stat().st_size > 0, 60)
            time.sleep(rng.uniform(1.5, 4.0))
            child.send_signal(signal.SIGKILL)
            killed_at = time.time()
            child.wait(10)
            samples = [line.split() for line in progress.read_text().splitlines() if len(line.split()) == 2]
            due = max((int(n) for t, n in samples if float(t) <= killed_at - 1.0), default=0)
            sql = "SELECT count(*) FROM trace_events WHERE run_id = ?"
            _wait_until(lambda: _query(config, sql, [run_id])[0][0] >= due, 30, 0.25)
            rounds.append({"due": due, "stored": _query(config, sql, [run_id])[0][0],
                           "emitted": max((int(n) for _, n in samples), default=0)})
    finally:
        down(config)
    return {"kills": kills, "rounds": rounds, "all_kept": all(r["stored"] >= r["due"] > 0 for r in rounds)}


def burst_child(rank: int, world: int, seconds: float, config, results) -> None:
    from rankstream.producers.producer import Producer

    before_mb = _rss_mb(os.getpid())  # what the fork inherited, before any producer existed
    producer = Producer(run_id="burst", rank=rank, world_size=world, config=config)
    deadline = time.monotonic() + seconds
    step = 0
    while time.monotonic() < deadline:
        for index in range(1000):
            producer.emit("burst_op", "cpu_op", "X", ts_ns=time.time_ns(), dur_ns=1000, pid=rank, tid=1, step=step,
                          flow_id=None, correlation_id=index)
        step += 1
    emitted_stats = producer.stats()
    closing = time.monotonic()
    stats = producer.close(timeout_s=120)
    close_s = time.monotonic() - closing
    if producer._thread.is_alive():  # where the sender still is, for the report
        import traceback

        frame = sys._current_frames().get(producer._thread.ident)
        print(f"rank {rank}: sender still running after close:\n" + "".join(traceback.format_stack(frame)[-6:]),
              file=sys.stderr)
    from rankstream.producers.spool import Spool

    spool = Spool(config.spool_dir, "burst", rank, max_bytes=config.producer.spool_max_bytes)
    left = sum(m.events for path in sorted(spool.directory.glob("*.seg")) for m in spool.read_segment(path))
    results.put({"rank": rank, "emitted": stats.events_emitted, "sent": stats.events_sent, "left_in_spool": left,
                 "dropped": stats.events_dropped, "spooled": stats.events_spooled,
                 "buffered_at_end": emitted_stats.buffered_events,
                 "rss_mb": _rss_mb(os.getpid(), "VmHWM"), "before_mb": before_mb, "broker_resets": stats.broker_resets,
                 "close_s": close_s, "closed": not producer._thread.is_alive()})


def burst(root: Path, ranks: int, seconds: float) -> dict:
    """``ranks`` producer processes at full rate, forked (64 interpreter starts would take the burst)."""
    from rankstream.deploy.broker import broker_status
    from rankstream.services import materializer_pid
    from rankstream.spools import deliver_spools

    caps = {"producer.max_buffered_events": 100_000, "producer.max_inflight_bytes": 16 << 20,
            "producer.resend_window_bytes": 16 << 20}
    config = load_config({"db_path": root / "burst.duckdb", "state_dir": root / "bstate", "broker_port": _free_port(),
                          "partitions": 8, **caps}, env={})
    up(config)
    context = mp.get_context("fork")
    results = context.Queue()
    try:
        broker, materializer = broker_status(config).pid, materializer_pid(config)
        children = [context.Process(target=burst_child, args=(r, ranks, seconds, config, results))
                    for r in range(ranks)]
        started = time.monotonic()
        for child in children:
            child.start()
        peak = {"lag": 0, "broker_mb": 0.0, "materializer_mb": 0.0}
        reports, burst_over = [], None
        while len(reports) < ranks:
            now = time.monotonic()
            if burst_over is None and now - started >= seconds:
                burst_over = now
            status = _materializer_status(config)
            peak["lag"] = max(peak["lag"], status.get("lag_messages") or 0)
            peak["broker_mb"] = max(peak["broker_mb"], _rss_mb(broker))
            peak["materializer_mb"] = max(peak["materializer_mb"], _rss_mb(materializer))
            while not results.empty():
                reports.append(results.get())
            time.sleep(0.25)
        for child in children:
            child.join(30)
        sent = sum(r["sent"] for r in reports)

        def caught_up() -> bool:
            status = _materializer_status(config)
            peak["materializer_mb"] = max(peak["materializer_mb"], _rss_mb(materializer))
            return status.get("events", 0) >= sent and status.get("lag_messages") == 0

        _wait_until(caught_up, 600, 0.5)
        caught_up_s = time.monotonic() - (burst_over or started)
        stored = _query(config, "SELECT count(*) FROM trace_events WHERE run_id = 'burst'")[0][0]
        flushed_s = time.monotonic()
        deliver_spools(config, wait_s=300)  # what `rankstream flush` does: the spools left at exit
        flushed_s = time.monotonic() - flushed_s
        stored_after_flush = _query(config, "SELECT count(*) FROM trace_events WHERE run_id = 'burst'")[0][0]
        rejects = _query(config, "SELECT count(*), any_value(reason) FROM rejects")[0]
        materializer_status = _materializer_status(config)
    finally:
        down(config)
    return {"ranks": ranks, "seconds": seconds, "emitted": sum(r["emitted"] for r in reports), "sent": sent,
            "dropped": sum(r["dropped"] for r in reports), "spooled": sum(r["spooled"] for r in reports),
            "left_in_spool": sum(r["left_in_spool"] for r in reports), "stored": stored, "caught_up_s": caught_up_s,
            "stored_after_flush": stored_after_flush, "flush_s": flushed_s, "producer_mb": max(r["rss_mb"] for r in reports),
            "growth_mb": max(r["rss_mb"] - r["before_mb"] for r in reports), **peak,
            "caps": caps, "rejects": rejects[0], "reject_reason": rejects[1],
            # producers whose close returned before their sender finished: what they still held is lost
            "close_timed_out": [(r["rank"], round(r["close_s"])) for r in reports if not r["closed"]],
            "producer_resets": sum(r["broker_resets"] for r in reports),
            "materializer_resets": materializer_status.get("broker_resets", 0),
            "duplicates": materializer_status.get("duplicates", 0)}


def fuzz(root: Path, count: int) -> dict:
    """Malformed messages through the real broker into a real materializer process."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kafka import KafkaProducer

    from rankstream.producers.kafka_client import client_options
    from tests.doubles import MemoryBus, MemoryTransport
    from rankstream.services import materializer_pid
    from rankstream.producers.producer import Producer
    from rankstream.demo.synthetic import SyntheticJob, run_synthetic_rank
    from tests.reliability.damage import MUTATIONS, mutate

    config = load_config({"db_path": root / "fuzz.duckdb", "state_dir": root / "fstate", "broker_port": _free_port(),
                          "partitions": 4}, env={})
    memory = MemoryBus(partitions=1)
    emitted = 0
    for rank in range(2):  # the valid job, captured first, so it can be interleaved with damage
        producer = Producer(run_id="fuzzed", rank=rank, world_size=2, config=config, transport=MemoryTransport(memory))
        emitted += run_synthetic_rank(SyntheticJob("fuzzed", 2, 20, events_per_step=200), rank, producer)
        producer.close()
    valid = [(r.topic, r.key, r.value) for t in memory.topics() for r in memory.read(t, 0, 0, 10**7)]
    rng = random.Random(5)
    bad = [mutate(rng.choice(valid), rng.choice(MUTATIONS), rng) for _ in range(count)]
    mixed = bad + valid
    rng.shuffle(mixed)
    up(config)
    try:
        pid = materializer_pid(config)
        sender = KafkaProducer(**client_options(config), max_request_size=24 << 20)
        for topic, key, value in mixed:
            sender.send(topic, key=key, value=value)
        sender.flush(60)
        sender.close()
        drained_s = _wait_until(lambda: _materializer_status(config).get("lag_messages") == 0
                                and _materializer_status(config).get("messages", 0) >= len(mixed), 300, 0.5)
        alive = materializer_pid(config) == pid
        rejects, events = _query(config, "SELECT (SELECT count(*) FROM rejects WHERE reason <> ''), "
                                 "(SELECT count(*) FROM trace_events WHERE run_id = 'fuzzed')")[0]
    finally:
        down(config)
    return {"tried": count, "rejects": rejects, "valid_events": emitted, "stored_events": events,
            "materializer_survived": alive, "drained_s": drained_s}


SECTIONS = ("burst", "broker-down", "materializer-crash", "broker-restart", "rank-kill", "fuzz")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--spool-mb", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=4, help="runs per mode (step times vary ~10%% run to run)")
    parser.add_argument("--outage-s", type=float, default=2.0, help="how long the restarted broker is gone")
    parser.add_argument("--rank-kills", type=int, default=5)
    parser.add_argument("--burst-ranks", type=int, default=64)
    parser.add_argument("--burst-s", type=float, default=10.0)
    parser.add_argument("--fuzz", type=int, default=10_000, help="malformed messages sent through the real broker")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--rank-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_child:
        rank_child(*args.rank_child)
        return
    root = Path(tempfile.mkdtemp(prefix="rankstream-soak-"))
    if "burst" in args.only:  # first: it forks, which is safest before this process starts any thread
        row = burst(root, args.burst_ranks, args.burst_s)
        print(f"== {row['ranks']}-rank burst: producer processes emitting at full rate for {row['seconds']:.0f} s "
              f"on this machine's {os.cpu_count()} cores")
        print(f"  events accepted {row['emitted']:,} (dropped at the producers' caps {row['dropped']:,}); stored "
              f"{row['stored']:,}, left in the spools at exit {row['left_in_spool']:,} (resent when a rank restarts); "
              f"spooled at some point {row['spooled']:,}")
        print(f"  after delivering the spools (`rankstream flush`, {row['flush_s']:.1f} s): stored "
              f"{row['stored_after_flush']:,} of {row['emitted']:,} accepted")
        print(f"  acknowledged by the broker {row['sent']:,}; producers whose close returned before their sender "
              f"finished (rank, close s): {row['close_timed_out'] or 'none'}")
        print(f"  peak lag {row['lag']:,} messages; caught up {row['caught_up_s']:.1f} s after the burst ended; "
              f"duplicates skipped {row['duplicates']:,}, rejects {row['rejects']:,}"
              + (f" ({row['reject_reason']})" if row["rejects"] else "")
              + f"; broker restarts seen by producers {row['producer_resets']}, by the materializer {row['materializer_resets']}")
        print(f"  peak RSS: producer process {row['producer_mb']:.0f} MB, at most {row['growth_mb']:.0f} MB more than "
              f"before its producer existed (caps {row['caps']}), broker {row['broker_mb']:.0f} MB, "
              f"materializer {row['materializer_mb']:.0f} MB")
    if "broker-down" in args.only:
        broker_down_section(root, args)
    if "materializer-crash" in args.only:
        row = materializer_crashes(root, args.kills)
        print(f"== materializer SIGKILLed {row['kills']} times mid-stream (one during --rebuild)")
        print(f"  events emitted {row['emitted']:,}, stored {row['stored']:,}, repeated batches {row['repeats']}; "
              f"final catch-up {row['final_catch_up_s']:.1f} s")
    if "broker-restart" in args.only:
        for name, window in (("restart", None), ("restart-small-window", 256 << 10)):
            row = broker_restart(root, name, window, args.outage_s)
            label = "default resend window" if window is None else f"resend window cut to {window >> 10} KB"
            print(f"== broker SIGKILLed and restarted after {args.outage_s:.0f} s, materializer paused across it "
                  f"({label})")
            recovery = "never (within 30 s)" if row["recovery_s"] is None else f"{row['recovery_s']:.1f} s"
            print(f"  events emitted {row['emitted']:,}, stored {row['stored']:,}, repeated batches {row['repeats']}; "
                  f"resent {row['resent']:,}; every event emitted before the kill stored {recovery} after the "
                  "broker was back")
            print(f"  restarts seen by every producer {row['resets']}, in status {row['status_resets']}; counted as "
                  f"not resent {row['not_resent']:,}, missing messages {row['missing_messages']:,} "
                  f"(lost events: {row['emitted'] - row['stored']:,})")
    if "rank-kill" in args.only:
        row = rank_kills(root, args.rank_kills)
        print(f"== a rank SIGKILLed mid-step, {row['kills']} times")
        for r in row["rounds"]:
            print(f"  emitted {r['emitted']:,} at the last progress note (of which {r['due']:,} more than 1 s before the kill), stored {r['stored']:,}")
        print(f"  every event emitted more than 1 s before the kill stored: {row['all_kept']}")
    if "fuzz" in args.only:
        row = fuzz(root, args.fuzz)
        print(f"== {row['tried']:,} malformed messages through the real broker, interleaved with a valid job")
        print(f"  rejected with a reason {row['rejects']:,}; valid events stored {row['stored_events']:,} of "
              f"{row['valid_events']:,}; materializer crashes {0 if row['materializer_survived'] else 'at least 1'}; "
              + ("NOT DRAINED after 300 s" if row["drained_s"] is None else f"all read in {row['drained_s']:.1f} s"))


def broker_down_section(root: Path, args) -> None:
    row = broker_down(root, args.steps, args.spool_mb, args.repeats)
    print(f"== broker down for a whole 2-rank gloo run ({args.repeats} x {args.steps} steps per mode, interleaved; "
          "spans + counters + FR tap)")
    print(f"  step time: without rankstream {row['off_ms']:.2f} ms, with rankstream and no broker {row['on_ms']:.2f} ms "
          f"-> {100 * (row['ratio'] - 1):+.1f}% (target within 5%)")
    print(f"  median step time, per interleaved pair: {100 * (row['pair_ratio'] - 1):+.1f}% "
          f"+- {100 * row['pair_spread']:.1f}% (two standard errors over {args.repeats} pairs: "
          + " ".join(f"{100 * (r - 1):+.0f}%" for r in row["pairs"]) + ")")
    for mode, label in (("off", "without rankstream"), ("on", "with rankstream")):
        print(f"  step time {label}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in row["quantiles"][mode].items()))
    print(f"  a step's rankstream calls (step marker, 5 spans, 40 counters) on the training thread, spool "
          f"{'refusing' if row['api_refusing'] else 'NOT refusing'}: {row['api_us_per_step']:.1f} us of CPU "
          f"({API_STEPS:,} steps timed apart) = {100 * row['api_us_per_step'] / (1000 * row['on_ms']):.1f}% of a step")
    print("  CPU per second of training, by thread: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in row["cpu_ms_per_s"].items()))
    print(f"  events emitted (all runs) {row['emitted']:,}, spooled {row['spooled']:,}, dropped {row['dropped']:,}; spool "
          f"{row['spool_mb']:.1f} MB of its {row['spool_cap_mb']} MB cap; peak RSS {row['rss_on_mb']:.0f} MB "
          f"vs {row['rss_off_mb']:.0f} MB without rankstream")
    print(f"  producer last_error: {row['last_error']}")
    print(f"  broker back: {row['arrived']:,} of {row['spooled']:,} spooled events in DuckDB after {row['drained_s']:.1f} s "
          "(broker + materializer start, ranks resend their spools)")


if __name__ == "__main__":
    main()
