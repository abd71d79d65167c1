"""A user's own loop under torchslurm.init() (no Trainer): steps of one all_reduce and a short sleep,
until a file `stop` appears in the working directory. Prints `rank R: N steps` at the end."""

import time
from pathlib import Path

import torch
import torch.distributed as dist

import torchslurm


def step(value: torch.Tensor) -> None:
    dist.all_reduce(value)
    time.sleep(0.05)


with torchslurm.init(timeout_s=60) as ctx:
    done = 0
    while True:
        step(torch.ones(1))
        done += 1
        stop = torch.tensor([float(Path("stop").exists() or done > 3000)])
        dist.all_reduce(stop)
        if stop.item():
            break
    print(f"rank {ctx.rank}: {done} steps", flush=True)
