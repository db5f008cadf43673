"""Ingest benchmark: N producer processes -> embedded broker -> materializer -> DuckDB.

Prints, for this machine, measured in one run:

1. the producer's cost on the calling (training) thread, ns/event, next to the peer: Composer's
   JSON trace handler records each event by building a dict, ``json.dumps`` and
   ``queue.put_nowait`` on the calling thread (re-implemented here from that behaviour);
2. end-to-end events/s sustained over ``--seconds`` (default 60): what the materializer committed
   to DuckDB while N producer processes offer ``--rate`` events/s in total;
3. freshness: time from ``emit`` of a probe event to its visibility through ``rankstream sql``'s
   route (the query server), p50 and p99;
4. peak RSS of every process;
5. each part alone, in the same run: the producers and the broker (the producers fill the topics
   as fast as they can, no materializer), then the materializer (``consume --once`` drains that
   backlog; its capacity when producers run on other machines, as ranks do); and the end-to-end
   rate against the slower of the two (the issue's fallback target: within 1.25x);
6. the floor under that target, from the CPU each part used per event alone: the rate the parts
   could reach sharing the cores with perfect overlap.

Usage: python bench/ingest.py [--producers 2] [--seconds 60] [--rate 1200000] [--quick]
Targets (issues 2 and 28): >= 1,000,000 events/s offered end to end with 0 lost and p99
freshness <= 2 s (or, failing that, end to end within 1.25x of the slowest part alone), and
<= 1 us/event on the calling thread.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from rankstream.schemas.settings import config_env, load_config
from rankstream.consumers.query import connect
from rankstream.consumers.query_server import server_socket
from rankstream.deploy.broker import stop_broker
from rankstream.schemas.processes import stop_process
from rankstream.services import start_embedded_broker
from rankstream.producers.producer import Producer

NAMES = ("aten::linear", "aten::addmm", "aten::relu", "aten::mm", "aten::sum", "gloo:all_reduce")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- 1. calling-thread cost ---------------------------------------------------------------------
class ComposerStyleRecorder:
    """The per-event work Composer's JSONTraceHandler does on the calling thread."""

    def __init__(self) -> None:
        self._queue: queue.Queue[str] = queue.Queue()

    def record(self, name: str, ph: str, wall_clock_ns: int, pid: int, tid: int, categories: str = "") -> None:
        data = {"name": name, "cat": categories, "ph": ph, "ts": wall_clock_ns // 1000, "pid": pid, "tid": tid}
        self._queue.put_nowait(json.dumps(data, indent=None))


def calling_thread_cost(config, events: int) -> dict[str, float]:
    # No materializer runs here: the calling thread's cost is measured, not delivery.
    producer = Producer(run_id="bench-hot-path", rank=0, world_size=1, config=config, confirm_stored=False)
    recorder = ComposerStyleRecorder()
    timings = {"rankstream": [], "composer": []}
    for _ in range(3):
        started = time.perf_counter_ns()
        emit = producer.emit
        for i in range(events):
            emit(NAMES[i % 6], "cpu_op", "X", ts_ns=i, dur_ns=1_000, pid=1, tid=1, step=i >> 10)
        timings["rankstream"].append((time.perf_counter_ns() - started) / events)
        producer.flush(timeout_s=30)
        started = time.perf_counter_ns()
        record = recorder.record
        for i in range(events):
            record(NAMES[i % 6], "X", i, 1, 1, "cpu_op")
        timings["composer"].append((time.perf_counter_ns() - started) / events)
        recorder._queue = queue.Queue()
    producer.close()
    return {name: min(values) for name, values in timings.items()}


# -- 2. end to end --------------------------------------------------------------------------------
def producer_process(rank: int, world: int, rate: float, seconds: float, env: dict, results,
                     limit: int | None = None) -> None:
    os.environ.update(env)
    config = load_config()
    # Filling a backlog (``limit``) runs with no materializer: nothing would announce what it stored,
    # and the part measured alone is producing to the broker.
    cpu_started, started_at = time.process_time(), time.time()  # after the imports: startup is not its cost
    producer = Producer(run_id="bench-ingest", rank=rank, world_size=world, config=config,
                        confirm_stored=limit is None)
    chunk = 1000
    interval = chunk / rate
    started = time.monotonic()
    next_at = started
    emitted = 0
    ts = time.time_ns()
    emit = producer.emit
    while time.monotonic() - started < seconds and (limit is None or emitted < limit):
        for i in range(chunk):
            emit(NAMES[i % 6], "cpu_op", "X", ts_ns=ts + i, dur_ns=1_000, pid=rank, tid=1, step=emitted >> 12)
        emitted += chunk
        if limit is not None:  # filling a backlog: keep pace with the sender thread, drop nothing
            while producer.stats().buffered_events > 100_000:
                time.sleep(0.001)
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    stats = producer.close(timeout_s=60)
    results.put({"rank": rank, "emitted": emitted, "sent": stats.events_sent, "dropped": stats.events_dropped,
                 "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                 "cpu_s": time.process_time() - cpu_started, "started_at": started_at, "done_at": time.time()})


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def children_cpu_seconds() -> float:
    """User + system CPU of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def stored_events(database) -> tuple[float, int]:
    """(time, events committed for the benchmark run), read through the query server."""
    count = database.fetchall(
        "SELECT coalesce(sum(events), 0)::BIGINT FROM ingested_batches WHERE run_id = 'bench-ingest'")[0][0]
    return time.monotonic(), count


class PeakRss:
    """Samples the RSS of some processes every 0.25 s and keeps each one's peak."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.peaks = {name: 0.0 for name in pids}
        self._processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for name, process in self._processes.items():
                try:
                    self.peaks[name] = max(self.peaks[name], process.memory_info().rss / 2**20)
                except psutil.Error:
                    pass

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return self.peaks


def freshness_probe(config, stop: threading.Event, samples: list[float]) -> None:
    producer = Producer(run_id="bench-probe", rank=0, world_size=1, config=config)
    database = connect(config.db_path, wait_s=30)
    marker = 0
    while not stop.is_set():
        emitted_at = time.monotonic()
        producer.emit("freshness-probe", "probe", "i", ts_ns=time.time_ns(), dur_ns=0, pid=0, tid=0, step=marker)
        marker += 1
        while not stop.is_set():
            visible = database.fetchall(
                "SELECT count(*) FROM ingested_batches WHERE run_id = 'bench-probe' AND stream = 'trace'")[0][0]
            if visible >= marker:
                samples.append(time.monotonic() - emitted_at)
                break
            time.sleep(0.05)  # each look is a query the materializer answers on the cores it shares
        stop.wait(0.25)
    producer.close(timeout_s=5)


def end_to_end(producers: int, seconds: float, rate: float) -> dict:
    state_dir = Path(tempfile.mkdtemp(prefix="rankstream-bench-"))
    config = load_config({"db_path": state_dir / "bench.duckdb", "state_dir": state_dir,
                          "broker_port": free_port(), "topic_prefix": "bench"}, env={})
    env = config_env(config)
    broker = start_embedded_broker(config)
    materializer = subprocess.Popen([sys.executable, "-m", "rankstream", "consume"], env={**os.environ, **env},
                                    stdout=subprocess.DEVNULL, stderr=open(state_dir / "materializer.log", "w"))
    while server_socket(config.db_path) is None:
        time.sleep(0.05)
    rss = PeakRss({"broker": broker.pid, "materializer": materializer.pid})
    services_cpu_started = cpu_seconds(broker.pid) + cpu_seconds(materializer.pid)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [context.Process(target=producer_process, args=(r, producers, rate / producers, seconds, env, results))
               for r in range(producers)]
    stop_probe = threading.Event()
    freshness: list[float] = []
    probe = threading.Thread(target=freshness_probe, args=(config, stop_probe, freshness), daemon=True)
    for worker in workers:
        worker.start()
    probe.start()
    database = connect(config.db_path, wait_s=30)
    warm_up = min(5.0, seconds / 4)  # connections, first topic metadata
    time.sleep(warm_up)
    first = stored_events(database)
    time.sleep(max(1.0, seconds - warm_up - 0.5))
    last = stored_events(database)
    stop_probe.set()
    reports = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    probe.join(timeout=30)
    emitted = sum(r["emitted"] for r in reports)
    drain_started = time.monotonic()
    stored = 0
    while time.monotonic() - drain_started < 300:
        stored = database.fetchall("SELECT count(*) FROM trace_events WHERE run_id = 'bench-ingest'")[0][0]
        if stored >= emitted - sum(r["dropped"] for r in reports):
            break
        time.sleep(0.5)
    catch_up_s = time.monotonic() - drain_started
    services_cpu = cpu_seconds(broker.pid) + cpu_seconds(materializer.pid) - services_cpu_started
    peaks = rss.stop()
    stop_process(materializer.pid, timeout_s=30)
    stop_broker(config)
    window_s = last[0] - first[0]
    window_events = last[1] - first[1]
    freshness.sort()
    return {
        "producers": producers,
        "offered_events_per_s": rate,
        "sustained_events_per_s": window_events / window_s if window_s > 0 else 0.0,
        "window_s": window_s,
        "emitted": emitted,
        "stored": stored,
        "dropped": sum(r["dropped"] for r in reports),
        "catch_up_after_stop_s": catch_up_s,
        "freshness_p50_s": statistics.median(freshness) if freshness else None,
        "freshness_p99_s": freshness[min(len(freshness) - 1, int(len(freshness) * 0.99))] if freshness else None,
        "freshness_samples": len(freshness),
        "peak_rss_mb": {**{f"producer{r['rank']}": r["rss_mb"] for r in reports}, **peaks},
        # Every part's CPU over the whole run (freshness probe aside), per event stored.
        "cpu_us_per_stored_event": 1e6 * (services_cpu + sum(r["cpu_s"] for r in reports)) / max(stored, 1),
    }


def drain_rate(producers: int, events: int) -> dict:
    """Materializer capacity alone: producers fill the topics first, then ``consume --once`` drains them."""
    state_dir = Path(tempfile.mkdtemp(prefix="rankstream-bench-drain-"))
    config = load_config({"db_path": state_dir / "drain.duckdb", "state_dir": state_dir,
                          "broker_port": free_port(), "topic_prefix": "drain"}, env={})
    env = config_env(config)
    broker = start_embedded_broker(config)
    try:
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        per_producer = events // producers
        broker_cpu_started = cpu_seconds(broker.pid)
        # Offer far more than can be encoded, capped by count: fills the topics as fast as possible.
        workers = [context.Process(target=producer_process, args=(r, producers, 10_000_000, 3600, env, results),
                                   kwargs={"limit": per_producer}) for r in range(producers)]
        fill_started = time.monotonic()
        for worker in workers:
            worker.start()
        reports = [results.get(timeout=900) for _ in workers]
        fill_s = time.monotonic() - fill_started  # process start included, as the drain's includes its own
        for worker in workers:
            worker.join()
        sent = sum(r["sent"] for r in reports)
        fill_cpu_s = sum(r["cpu_s"] for r in reports) + cpu_seconds(broker.pid) - broker_cpu_started
        elapsed, drain_cpu_s = consume_once(env, broker.pid)
        stored = connect(config.db_path).fetchall("SELECT count(*) FROM trace_events")[0][0]
        # The same command again, with nothing left to read: what starting and stopping cost.
        startup_s, startup_cpu_s = consume_once(env, broker.pid)
    finally:
        stop_broker(config)
    return {"events": stored, "sent": sent, "seconds": elapsed, "events_per_s": stored / elapsed,
            "startup_seconds": startup_s, "events_per_s_past_startup": stored / max(elapsed - startup_s, 1e-9),
            "fill_seconds": fill_s, "fill_events_per_s": sent / fill_s,
            "fill_events_per_s_past_startup":
                sent / max(max(r["done_at"] for r in reports) - min(r["started_at"] for r in reports), 1e-9),
            "fill_cpu_us_per_event": 1e6 * fill_cpu_s / max(sent, 1),
            "drain_cpu_us_per_event": 1e6 * max(drain_cpu_s - startup_cpu_s, 0.0) / max(stored, 1)}


def consume_once(env: dict, broker_pid: int) -> tuple[float, float]:
    """Run ``consume --once`` to the end of the bus: (wall seconds, CPU seconds of it and the broker)."""
    broker_cpu_started, materializer_cpu_started = cpu_seconds(broker_pid), children_cpu_seconds()
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "rankstream", "consume", "--once", "--no-serve-sql"],
                   env={**os.environ, **env}, check=True, capture_output=True)
    elapsed = time.monotonic() - started
    return elapsed, children_cpu_seconds() - materializer_cpu_started + cpu_seconds(broker_pid) - broker_cpu_started


def shared_core_ceiling(drain: dict, cores: int) -> float:
    """Events/s the parts could reach together on ``cores`` shared cores if they overlapped
    perfectly: every event costs what the producers and the broker spent per event filling the
    backlog plus what the materializer and the broker spent draining it (less the materializer's
    process startup, measured by a second run with nothing to read)."""
    return cores * 1e6 / (drain["fill_cpu_us_per_event"] + drain["drain_cpu_us_per_event"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=1_000_000, help="offered events/s, all producers together")
    parser.add_argument("--hot-path-events", type=int, default=1_000_000)
    parser.add_argument("--drain-events", type=int, default=6_000_000, help="backlog for the materializer-alone run")
    parser.add_argument("--quick", action="store_true", help="10 s and 200k hot-path events, for a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.hot_path_events, args.drain_events = 10.0, 200_000, 1_000_000

    state_dir = Path(tempfile.mkdtemp(prefix="rankstream-bench-hot-"))
    config = load_config({"db_path": state_dir / "hot.duckdb", "state_dir": state_dir, "broker_port": free_port(),
                          "topic_prefix": "hot"}, env={})
    start_embedded_broker(config)
    try:
        hot = calling_thread_cost(config, args.hot_path_events)
    finally:
        stop_broker(config)
    e2e = end_to_end(args.producers, args.seconds, args.rate)
    drain = drain_rate(args.producers, args.drain_events)

    print(f"\nrankstream ingest benchmark ({os.cpu_count()} cores)")
    print("calling-thread cost per event (min of 3 x {:,} events):".format(args.hot_path_events))
    print(f"  rankstream Producer.emit         {hot['rankstream']:8.0f} ns   (target <= 1000 ns: "
          f"{hot['rankstream'] / 1000:.2f}x of budget)")
    print(f"  Composer-style json+queue        {hot['composer']:8.0f} ns")
    print(f"  ratio composer / rankstream      {hot['composer'] / hot['rankstream']:8.1f}x")
    print(f"end to end, {e2e['producers']} producer processes offering {e2e['offered_events_per_s']:,.0f} events/s "
          f"for {args.seconds:.0f} s:")
    print(f"  sustained into DuckDB            {e2e['sustained_events_per_s']:12,.0f} events/s over "
          f"{e2e['window_s']:.0f} s  ({e2e['sustained_events_per_s'] / 1e6:.2f}x of the 1M/s target)")
    print(f"  emitted / stored / dropped       {e2e['emitted']:,} / {e2e['stored']:,} / {e2e['dropped']:,}"
          f"  (never stored: {e2e['emitted'] - e2e['stored']:,}, "
          f"not counted as dropped: {e2e['emitted'] - e2e['stored'] - e2e['dropped']:,})")
    print(f"  caught up after producers stop   {e2e['catch_up_after_stop_s']:.1f} s")
    if e2e["freshness_p50_s"] is not None:
        print(f"  freshness emit -> sql            p50 {e2e['freshness_p50_s']:.3f} s, p99 "
              f"{e2e['freshness_p99_s']:.3f} s over {e2e['freshness_samples']} probes (target p99 <= 2 s)")
    print("  peak RSS (MB)                    " + ", ".join(f"{k} {v:.0f}" for k, v in e2e["peak_rss_mb"].items()))
    offered = e2e["emitted"] / args.seconds
    never_stored = e2e["emitted"] - e2e["stored"]
    p99 = e2e["freshness_p99_s"]
    met = offered >= 0.999 * 1e6 and never_stored == 0 and p99 is not None and p99 <= 2.0
    print(f"  target: >= 1M events/s offered, 0 lost, p99 <= 2 s: {'MET' if met else 'NOT MET'} "
          f"({offered:,.0f} offered, {never_stored:,} never stored, p99 "
          + (f"{p99:.3f} s)" if p99 is not None else "not measured)"))
    print(f"each part alone ({drain['events']:,}-event backlog, process startup included):")
    print(f"  producers + broker (fill)        {drain['fill_events_per_s']:12,.0f} events/s in "
          f"{drain['fill_seconds']:.1f} s; {drain['fill_events_per_s_past_startup']:,.0f} from first emit to close")
    print(f"  materializer (consume --once)    {drain['events_per_s']:12,.0f} events/s in {drain['seconds']:.1f} s "
          f"({drain['events_per_s'] / 1e6:.2f}x of the 1M/s target); {drain['events_per_s_past_startup']:,.0f} "
          f"past its {drain['startup_seconds']:.1f} s startup")
    # Startup excluded on both sides, as the end-to-end window excludes it (its warm-up).
    slowest = min(drain["fill_events_per_s_past_startup"], drain["events_per_s_past_startup"])
    e2e_rate = max(e2e["sustained_events_per_s"], 1)
    print(f"  slowest part / end to end        {slowest / e2e_rate:8.2f}x "
          "(the fallback, judged only when the target above is not met: <= 1.25x)")
    cores = os.cpu_count() or 1
    ceiling = shared_core_ceiling(drain, cores)
    reachable = min(slowest, ceiling)
    print(f"the floor: CPU per event, producers + broker filling {drain['fill_cpu_us_per_event']:.2f} us, "
          f"materializer + broker draining {drain['drain_cpu_us_per_event']:.2f} us")
    print(f"  shared-core ceiling ({cores} cores)   {ceiling:12,.0f} events/s if the parts overlapped perfectly")
    print(f"  best slowest / end to end        {slowest / reachable:8.2f}x "
          + ("(above 1.25x: the fallback cannot be met on these cores)" if slowest / reachable > 1.25
             else "(the fallback is reachable in principle)")
          + f"; end to end reached {e2e_rate / reachable:.2f} of the reachable rate")
    print(f"  end to end spent                 {e2e['cpu_us_per_stored_event']:8.2f} us of CPU per stored event "
          "(emitting the events dropped at the caps included)")
    # At 1M/s offered, emitting every event (stored or dropped) takes its share of the cores first.
    emit_us = hot["rankstream"] / 1000
    left = cores - offered * emit_us / 1e6
    per_stored = drain["fill_cpu_us_per_event"] - emit_us + drain["drain_cpu_us_per_event"]
    print(f"  ceiling at {offered:,.0f} offered   {max(left, 0) * 1e6 / per_stored:12,.0f} events/s stored "
          f"(emit takes {offered * emit_us / 1e6:.2f} of {cores} cores; end to end reached "
          f"{e2e_rate / max(left * 1e6 / per_stored, 1):.2f} of it)")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "ingest.json").write_text(json.dumps({"hot_path_ns": hot, "end_to_end": e2e, "drain": drain}, indent=2))


if __name__ == "__main__":
    main()
