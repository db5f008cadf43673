"""A training script that knows nothing of rankstream (for ``rankstream run`` tests).

    torchrun --nproc-per-node 2 plain_train.py --steps 30 [--skip-rank 1 --skip-step 12] [--exit-code 3]

gloo on CPU: a small model, an all_reduce of the loss each step, SGD. ``--skip-rank R`` makes
rank R skip the loss all_reduce at ``--skip-step`` and then stall (stuck outside the collectives,
as in a data loader): the others hang in that all_reduce until the timeout.
"""

import argparse
import datetime
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
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--optimizers", type=int, default=1)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    models = [torch.nn.Linear(64, 64) for _ in range(args.optimizers)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
    for step in range(args.steps):
        data = torch.randn(32, 64)
        loss = sum(m(data).pow(2).mean() for m in models)
        loss.backward()
        for model in models:
            for p in model.parameters():
                dist.all_reduce(p.grad)
        value = loss.detach().clone()
        if rank == args.skip_rank and step == args.skip_step:
            print(f"STALL rank {rank} step {step}", flush=True)
            time.sleep(args.timeout_s + 30)
            return 1
        dist.all_reduce(value)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    dist.barrier()
    dist.destroy_process_group()
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
