"""Rank 1 exits with code 7 after init; the others wait at a barrier and fail after it dies."""

import os
import sys

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    print("rank 1: failing on purpose", file=sys.stderr, flush=True)
    os._exit(7)
dist.barrier()
