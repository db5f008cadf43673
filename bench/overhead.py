"""Overhead benchmark: what profiling costs a training step, three ways, in one run.

A 2-rank gloo job trains the demo model (MLP, tensor-parallel all-gather, data-parallel
all-reduce) for ``--steps`` steps in each mode, on a fresh pair of processes per mode:

(a) no profiling;
(b) torch.profiler on a schedule, writing a Chrome JSON file per window with
    ``prof.export_chrome_trace`` (what Composer's TorchProfiler callback does);
(c) rankstream: the same schedule streamed with ``rankstream.profile`` (no file), plus the
    Flight Recorder tap and heartbeats, to the embedded broker.

Each mode runs ``--repeats`` times, interleaved with the others. It prints the mean step time of
each mode over all steps after the first ``WARMUP_STEPS`` (the steps that pay for a window's export
included), (c)/(b) and (c)/(a), and the training thread's time per
window in the ``on_trace_ready`` handler for (b) and (c). Targets (issue 3): (c)/(b) <= 1.0 and
(c)'s handler time per window no more than export_chrome_trace's.

Last, the floor under (c)/(b): in one process, the same model and schedule without gloo, the CPU
that only reading each window through torch's Python bindings takes (``trace_activities()`` and
the nine fields rankstream keeps, as ``producers.profiler.window_columns`` reads them), against the
CPU of ``export_chrome_trace`` on the same windows, which does all of (b)'s work in C++. When the
reading alone costs as much as the export, streaming (which also encodes, sends, and runs the
Flight Recorder tap and heartbeats) cannot cost a step less than (b) on cores the ranks keep busy.

Usage: python bench/overhead.py [--steps 200] [--batch 256]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch.multiprocessing as mp

SCHEDULE = dict(wait=1, warmup=1, active=3, repeat=0)
#: Steps left out of the mean in every mode (allocator and gloo warm-up).
WARMUP_STEPS = 20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker(rank: int, world: int, port: int, mode: str, steps: int, batch: int, out: str, env: dict) -> None:
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist
    import torch.profiler as tp

    handler_s: list[float] = []
    if mode == "rankstream":
        import rankstream
        from rankstream.producers.profiler import profile as streaming_profile

        session = rankstream.init(run_id=f"overhead-{port}", fr_interval_s=1.0)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    pair = dist.new_group([0, 1])
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def timed(handler):
        def call(prof):
            started = time.perf_counter()
            handler(prof)
            handler_s.append(time.perf_counter() - started)
        return call

    if mode == "none":
        profiler = None
    elif mode == "export":
        folder = Path(out) / f"traces-rank{rank}"
        folder.mkdir(exist_ok=True)
        counter = iter(range(10**6))
        profiler = tp.profile(activities=[tp.ProfilerActivity.CPU], schedule=tp.schedule(**SCHEDULE),
                              on_trace_ready=timed(lambda p: p.export_chrome_trace(
                                  str(folder / f"window{next(counter)}.json"))), record_shapes=True)
    else:
        profiler = streaming_profile(timed(session.profiler_stream()), **SCHEDULE, record_shapes=True)
        session.producer.flush(timeout_s=30)  # connected before timing: the one-off start-up is not a step cost
    step_s = []
    if profiler is not None:
        profiler.start()
    for step in range(steps):
        started = time.perf_counter()
        inputs, targets = torch.randn(batch, 256), torch.randint(0, 10, (batch,))
        hidden = model[1](model[0](inputs))
        gathered = [torch.empty_like(hidden) for _ in range(2)]
        dist.all_gather(gathered, hidden.detach(), group=pair)
        loss = torch.nn.functional.cross_entropy(model[2](hidden), targets)
        optimizer.zero_grad()
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(grads)
        optimizer.step()
        if profiler is not None:
            profiler.step()
        step_s.append(time.perf_counter() - started)
    if profiler is not None:
        profiler.stop()
    if mode == "rankstream":
        rankstream.shutdown()
    dist.destroy_process_group()
    if rank == 0:
        Path(out, f"{mode}.json").write_text(json.dumps({"step_s": step_s[WARMUP_STEPS:], "handler_s": handler_s}))


#: What ``window_columns`` reads from every Kineto activity, one binding call each.
ACTIVITY_FIELDS = ("name", "type", "timestamp", "duration", "device_id", "resource_id", "flow_id", "correlation_id",
                   "metadata_json")


def window_floor(batch: int, steps: int = 100) -> dict[str, float]:
    """Median CPU ms per window: reading it through the bindings, and ``export_chrome_trace``."""
    import torch
    import torch.profiler as tp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    reading, export, events = [], [], []
    folder = tempfile.mkdtemp(prefix="rankstream-floor-")

    def handler(prof) -> None:
        started = time.thread_time()
        activities = prof.profiler.kineto_results.trace_activities()
        kind = type(activities[0])
        for field in ACTIVITY_FIELDS:
            list(map(getattr(kind, field), activities))
        read = time.thread_time()
        prof.export_chrome_trace(str(Path(folder) / "window.json"))
        reading.append(read - started)
        export.append(time.thread_time() - read)
        events.append(len(activities))

    with tp.profile(activities=[tp.ProfilerActivity.CPU], schedule=tp.schedule(**SCHEDULE), record_shapes=True,
                    on_trace_ready=handler) as profiler:
        for _ in range(steps):
            inputs, targets = torch.randn(batch, 256), torch.randint(0, 10, (batch,))
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            profiler.step()
    return {"reading_ms": statistics.median(reading) * 1000, "export_ms": statistics.median(export) * 1000,
            "events": statistics.median(events), "windows": len(events)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from rankstream.schemas.settings import config_env, load_config
    from rankstream.deploy.broker import stop_broker
    from rankstream.services import start_embedded_broker

    out = tempfile.mkdtemp(prefix="rankstream-overhead-")
    config = load_config({"db_path": Path(out) / "o.duckdb", "state_dir": Path(out) / "state",
                          "broker_port": free_port()}, env={})
    start_embedded_broker(config)
    env = {**config_env(config), "TORCH_FR_BUFFER_SIZE": "2000"}
    results: dict[str, list] = {"none": [], "export": [], "rankstream": []}
    try:
        for _ in range(args.repeats):  # interleaved, so a slow minute of the VM hits every mode
            for mode in results:
                mode_env = env if mode == "rankstream" else {}
                mp.spawn(worker, args=(2, free_port(), mode, args.steps, args.batch, out, mode_env), nprocs=2)
                results[mode].append(json.loads(Path(out, f"{mode}.json").read_text()))
    finally:
        stop_broker(config)

    mean = {mode: statistics.mean(statistics.mean(r["step_s"]) for r in runs) for mode, runs in results.items()}
    handler = {mode: statistics.mean([h for r in runs for h in r["handler_s"]] or [0.0])
               for mode, runs in results.items()}
    print(f"\nrankstream overhead benchmark: 2 gloo ranks, {args.repeats} x {args.steps} steps per mode "
          f"(interleaved), batch {args.batch}, schedule {SCHEDULE}; mean step time over all steps")
    print(f"  (a) no profiling                   {mean['none'] * 1000:8.2f} ms/step")
    print(f"  (b) torch.profiler + export_chrome  {mean['export'] * 1000:8.2f} ms/step   "
          f"handler {handler['export'] * 1000:7.1f} ms/window")
    print(f"  (c) rankstream stream + FR tap      {mean['rankstream'] * 1000:8.2f} ms/step   "
          f"handler {handler['rankstream'] * 1000:7.1f} ms/window")
    print(f"  (c)/(b) step time {mean['rankstream'] / mean['export']:.3f} (target <= 1.0)   "
          f"(c)/(a) {mean['rankstream'] / mean['none']:.3f}")
    print(f"  handler time per window (c)/(b) {handler['rankstream'] / handler['export']:.3f} (target <= 1.0)")
    floor = window_floor(args.batch)
    print(f"  floor: reading a window ({floor['events']:.0f} events, median of {floor['windows']}) through torch's "
          f"bindings {floor['reading_ms']:.2f} ms CPU, export_chrome_trace {floor['export_ms']:.2f} ms CPU "
          f"(ratio {floor['reading_ms'] / floor['export_ms']:.2f})")
    results_dir = Path(__file__).parent / "results"
    results_dir.mkdir(exist_ok=True)
    (results_dir / "overhead.json").write_text(json.dumps({"mean_step_s": mean, "handler_s": handler,
                                                          "window_floor": floor}, indent=2))


if __name__ == "__main__":
    main()
