"""Calls torchslurm.init() and all_reduces its rank; prints one JSON line per rank."""

import json
import os
import resource
import socket
import sys

import torch
import torch.distributed as dist

import torchslurm

timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
with torchslurm.init(timeout_s=timeout) as ctx:
    value = torch.tensor([float(ctx.rank)])
    dist.all_reduce(value)
    record = {
        "script": "probe", "rank": ctx.rank, "world": ctx.world_size, "local_rank": ctx.local_rank,
        "launcher": ctx.env.launcher, "backend": ctx.backend, "device": str(ctx.device),
        "master": f"{ctx.env.master_addr}:{ctx.env.master_port}", "host": socket.gethostname(),
        "nic": dict(ctx.interface_env), "sum": value.item(),
        "hosts_store": ctx.env.hosts_store, "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "omp_threads": os.environ.get("OMP_NUM_THREADS"), "torch_threads": torch.get_num_threads(),
    }
    sys.stdout.write(json.dumps(record) + "\n")  # one write: the ranks share one pipe
    sys.stdout.flush()
