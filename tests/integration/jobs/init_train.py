"""A script that calls ``rankstream.init()`` before its process group exists, and prints the run
id it got (for the unique-run-id tests): ``torchrun ... init_train.py``."""

import datetime

import torch.distributed as dist

import rankstream

session = rankstream.init(fr_tap=False, clock_sync=False)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
print(f"RUN_ID {dist.get_rank()} {session.run_id}", flush=True)
rankstream.step()
dist.barrier()
dist.destroy_process_group()
rankstream.shutdown()
