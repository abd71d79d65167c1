"""One all_reduce through torchslurm.init(): proves a generated job script gives every rank a
working process group with no MASTER_ADDR/MASTER_PORT in the script."""

import os
import socket

import torch
import torch.distributed as dist

import torchslurm

with torchslurm.init(backend=os.environ.get("TORCHSLURM_BACKEND")) as ctx:
    value = torch.tensor([ctx.rank + 1.0])
    dist.all_reduce(value)
    env = ctx.env
    # one write with its newline: torchrun's workers share one pipe, and print()'s separate write of
    # the newline let two workers' lines run together ("allreduce=10rank 2 of 4 ...")
    print(f"rank {ctx.rank} of {ctx.world_size} on {socket.gethostname()} launcher={env.launcher} "
          f"master={env.master_addr}:{env.master_port} allreduce={value.item():g}\n", end="", flush=True)
