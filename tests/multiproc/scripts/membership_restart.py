"""Two torchrun agents ("nodes"), one worker each, --max-restarts=1. In the first round the rank-1
worker exits with code 3 while rank 0 sleeps outside any collective: rank 1's agent restarts
after a failure (TORCHELASTIC_RESTART_COUNT 1), rank 0's for a membership change, which torch does
not count (it stays 0). The second round must still form one process group.

argv: MARKER_DIR. Prints one JSON line per round-2 worker.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import torchslurm

marker, rank0_idle = Path(sys.argv[1]) / "rank1-failed", Path(sys.argv[1]) / "rank0-idle"
with torchslurm.init(timeout_s=60) as ctx:
    if not marker.exists():
        if ctx.rank == 1:
            # Only once rank 0 is out of init's collectives: a rank 0 still inside one would fail
            # too, its agent would count a failure, and both counts would be 1 (a slow rank 0 makes it happen).
            while not rank0_idle.exists():
                time.sleep(0.05)
            marker.touch()
            os._exit(3)
        rank0_idle.touch()
        time.sleep(120)  # stopped by its agent when the other node re-joins the rendezvous
    total = torch.ones(1)
    dist.all_reduce(total)
    record = {"rank": ctx.rank, "restart_count": os.environ["TORCHELASTIC_RESTART_COUNT"],
              "prefix": ctx.store_prefix, "sum": total.item()}
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()
