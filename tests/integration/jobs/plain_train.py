"""A training script that knows nothing of rankstream (for ``rankstream run`` tests).

    torchrun --nproc-per-node 2 plain_train.py --steps 30 [--skip-rank 1 --skip-step 12] [--exit-code 3]

gloo on CPU: a small model, an all_reduce of the loss each step, SGD. ``--skip-rank R`` makes
rank R skip the loss all_reduce at ``--skip-step`` and then stall (stuck outside the collectives,
as in a data loader): the others hang in that all_reduce until the timeout.
"""

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--skip-rank", type=int, default=-1)
    parser.add_argument("--skip-step", type=int, default=12)
    parser.add_argument("--timeout-s", type=float, default=120)
    parser.add_argument("--stall-in", choices=("sleep", "all_gather", "exit", "raise"), default="sleep",
                        help="where the skipping rank stalls: asleep, or blocked in an all_gather its peers never "
                             "join; exit: it dies there at once, without a word (os._exit); raise: a ValueError")
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--optimizers", type=int, default=1)
    parser.add_argument("--width", type=int, default=64, help="model width (bench/run_overhead.py: bigger steps)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device-ms", type=float, default=0.0,
                        help="wait this long per step after backward, as a GPU job waits on its device with the "
                             "cores free (bench/run_overhead.py --device-ms)")
    parser.add_argument("--report-slow", action="store_true", help="print every step's time (rank 0)")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    models = [torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                  torch.nn.Linear(args.width, args.width)) for _ in range(args.optimizers)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
    warm = min(10, args.steps // 2)
    last = time.perf_counter()
    for step in range(args.steps):
        now = time.perf_counter()
        if args.report_slow and rank == 0 and step > 1:
            print(f"STEP {step - 1} {(now - last) * 1000:.1f} ms", flush=True)
        last = now
        if step == warm:
            started, started_cpu = time.perf_counter(), time.process_time()
        data = torch.randn(args.batch, args.width)
        loss = sum(m(data).pow(2).mean() for m in models)
        loss.backward()
        if args.device_ms:
            time.sleep(args.device_ms / 1000)
        for model in models:
            for p in model.parameters():
                dist.all_reduce(p.grad)
        value = loss.detach().clone()
        if rank == args.skip_rank and step == args.skip_step:
            print(f"STALL rank {rank} step {step}", flush=True)
            if args.stall_in == "exit":
                os._exit(3)
            if args.stall_in == "raise":
                raise ValueError(f"bad batch on rank {rank} at step {step}")
            if args.stall_in == "all_gather":  # blocked in gloo, where no Python signal handler runs
                dist.all_gather([torch.empty_like(value) for _ in range(dist.get_world_size())], value)
            time.sleep(args.timeout_s + 30)
            return 1
        dist.all_reduce(value)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    if rank == 0 and args.steps > warm:
        measured = args.steps - warm
        print(f"STEP_MS {(time.perf_counter() - started) * 1000 / measured:.3f}", flush=True)
        # this process's CPU per step, every thread of it (a capture tool's threads too)
        print(f"STEP_CPU_MS {(time.process_time() - started_cpu) * 1000 / measured:.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
