"""Cluster-test probe: torchslurm.init(), one all_reduce, then one JSON line per rank on stdout.

The line says where the rank ran and what the runtime chose (master, NIC variables, device), the
all_reduce result, and the TCP connections this process holds (read from /proc/net/tcp*), which
prove which addresses the collective traffic used.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import torchslurm

NIC_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def _addr(hex_addr: str) -> str:
    """/proc/net/tcp{,6} address "0100007F:1F90" → "127.0.0.1:8080" (IPv4-mapped IPv6 shown as IPv4)."""
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    # The kernel prints each 32-bit word in host (little-endian) order.
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(raw) == 16 and raw[:12] == b"\0" * 10 + b"\xff\xff":
        raw = raw[12:]
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return f"{socket.inet_ntop(family, raw)}:{int(port, 16)}"


def tcp_connections() -> list[dict[str, str]]:
    """Established TCP connections owned by this process (its socket inodes among /proc/net/tcp*)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    conns = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                f = line.split()
                if f[3] == "01" and f[9] in inodes:  # 01 = ESTABLISHED
                    conns.append({"local": _addr(f[1]), "remote": _addr(f[2])})
    return conns


def main() -> int:
    start = time.monotonic()
    with torchslurm.init(timeout_s=60) as ctx:
        value = torch.tensor([float(ctx.rank + 1)])
        dist.all_reduce(value)
        conns = tcp_connections()
        record = {
            "probe": 1, "rank": ctx.rank, "world_size": ctx.world_size, "local_rank": ctx.local_rank,
            "local_world_size": ctx.env.local_world_size, "node_rank": ctx.env.node_rank,
            "host": socket.gethostname(), "launcher": ctx.env.launcher, "job_id": ctx.env.job_id,
            "master_addr": ctx.env.master_addr, "master_port": ctx.env.master_port,
            "hosts_store": ctx.env.hosts_store, "num_nodes": ctx.env.num_nodes, "reason": ctx.env.reason,
            "local_world_known": ctx.env.local_world_known,
            "backend": ctx.backend, "device": str(ctx.device), "interface_env": dict(ctx.interface_env),
            "nic_vars": {k: os.environ[k] for k in NIC_VARS if k in os.environ},
            "allreduce": value.item(), "expected": ctx.world_size * (ctx.world_size + 1) / 2,
            "connections": conns, "argv": sys.argv[1:], "seconds": round(time.monotonic() - start, 2),
        }
        dist.barrier()  # nobody tears down its sockets while a peer still reads its table
    write_record(record)
    return 0


def write_record(record: dict[str, object]) -> None:
    """One file per rank in the working directory (srun interleaves long stdout lines of several
    tasks), and a short line on stdout for the job log."""
    job, step = os.environ.get("SLURM_JOB_ID", "local"), os.environ.get("SLURM_STEP_ID", "x")
    Path(f"probe-{job}-{step}-{record['rank']}.json").write_text(json.dumps(record, sort_keys=True))
    print(f"probe rank={record['rank']} host={record['host']} allreduce={record.get('allreduce')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
