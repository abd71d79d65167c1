"""An unmodified torchrun-style script: reads RANK/LOCAL_RANK/WORLD_SIZE, init_process_group("gloo")."""

import json
import os
import sys

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
value = torch.tensor([float(rank)])
dist.all_reduce(value)
record = {"script": "torchrun_style", "rank": rank, "world": world,
          "local_rank": int(os.environ["LOCAL_RANK"]), "sum": value.item()}
sys.stdout.write(json.dumps(record) + "\n")  # one write: the ranks share one pipe
sys.stdout.flush()
dist.destroy_process_group()
