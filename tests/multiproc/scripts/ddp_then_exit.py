"""A Trainer-style flow: the DDP model lives in a function that returns before init() exits.

With 3+ Gloo ranks, torch aborts a process at exit ("terminate called without an active exception")
when a DistributedDataParallel is destroyed after its process group; whether it does depends on
thread timing. So this script checks the condition itself: the automatic garbage collector is off
(only an explicit collection can free the DDP's reference cycle), and a finalizer records whether
the process group still existed when the DDP was freed. Each rank prints that as a JSON line.
"""

import gc
import json
import sys
import weakref

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import torchslurm
from torchslurm.train.models import SimpleConvNet

freed_while_grouped: list[bool] = []


def evaluate_once() -> float:
    model = SimpleConvNet(8)
    ddp = DistributedDataParallel(model)
    ddp.eval()  # a reference cycle through the module tree: only the garbage collector frees it
    weakref.finalize(ddp, lambda: freed_while_grouped.append(dist.is_initialized()))
    with torch.no_grad():
        total = model(torch.randn(32, 1, 8, 8)).sum().reshape(1)
    dist.all_reduce(total)
    return float(total.item())


gc.disable()
with torchslurm.init() as ctx:
    evaluate_once()
# one write per line: print() writes the text and its newline separately, and three ranks share a pipe
sys.stdout.write(json.dumps({"rank": ctx.rank, "freed_while_grouped": freed_while_grouped}) + "\n")
sys.stdout.flush()
