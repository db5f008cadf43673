"""A pipeline of stages that move only by send/recv (for ``rankstream run`` tests).

    torchrun --nproc-per-node 3 pipeline.py --steps 200 [--stall-rank 1 --stall-step 20]

Each step, stage r receives an activation from stage r-1, computes, and sends it to stage r+1;
stage 0 takes ``--work-ms`` per step first, so the later stages spend most of their time blocked
in ``recv``, as real pipeline stages do. gloo records none of these calls in the Flight Recorder.
``--stall-rank R`` makes stage R stop in its own code at ``--stall-step``: the stages after it
block in ``recv``, the ones before it in ``send``, until the timeout.
"""

import argparse
import datetime
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--work-ms", type=float, default=50.0)
    parser.add_argument("--stall-rank", type=int, default=-1)
    parser.add_argument("--stall-step", type=int, default=20)
    parser.add_argument("--timeout-s", type=float, default=300)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    activation = torch.zeros(256)
    for step in range(args.steps):
        if rank == args.stall_rank and step == args.stall_step:
            print(f"STALL rank {rank} step {step}", flush=True)
            time.sleep(args.timeout_s + 60)
        if rank == 0:
            time.sleep(args.work_ms / 1000)
            activation = torch.randn(256)
        else:
            dist.recv(activation, src=rank - 1)
        activation = torch.tanh(activation * 1.01)
        if rank < world - 1:
            dist.send(activation, dst=rank + 1)
    print(f"DONE rank {rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
