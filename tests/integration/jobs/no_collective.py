"""A job that creates a process group and then issues no collective (each rank trains alone, as a
hyperparameter sweep launched with torchrun does): nothing for the collective diagnosis to read."""

import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(12):
        model(torch.randn(8, 16)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(0.02)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
