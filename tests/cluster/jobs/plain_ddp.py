"""An unmodified torchrun-style script: no torchslurm import, only the torchrun variables."""

import json
import os
import socket

import torch
import torch.distributed as dist

rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("gloo")
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
record = {"probe": 1, "rank": rank, "world_size": world_size, "local_rank": local_rank,
          "host": socket.gethostname(), "allreduce": value.item(), "expected": world_size * (world_size + 1) / 2}
with open(f"probe-{os.environ.get('SLURM_JOB_ID', 'local')}-plain-{rank}.json", "w") as fh:
    fh.write(json.dumps(record))
print(json.dumps(record), flush=True)
dist.destroy_process_group()
