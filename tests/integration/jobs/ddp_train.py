"""The most common real job, knowing nothing of rankstream: DistributedDataParallel on gloo fed by
a DataLoader with worker processes (for ``rankstream run`` tests).

    torchrun --nproc-per-node 2 ddp_train.py --steps 30 [--stall-rank 1 --stall-step 12]

``--stall-rank R`` makes rank R stop before its forward at ``--stall-step`` (as behind a stuck
data source), so its peer waits in DDP's gradient all-reduce.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--stall-rank", type=int, default=-1)
    parser.add_argument("--stall-step", type=int, default=12)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                                        torch.nn.Linear(128, 8)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 64), torch.randn(4096, 8))
    for step, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=32, num_workers=2)):
        if step == args.steps:
            break
        if rank == args.stall_rank and step == args.stall_step:
            print(f"STALL rank {rank} step {step}", flush=True)
            time.sleep(3600)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
