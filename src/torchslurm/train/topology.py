"""Where this process trains, as the Trainer sees it: rank, world, device, nodes and master.

torch is imported only when a topology is computed, so that this module imports without it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from torchslurm.runtime.distributed import DistContext


@dataclass(frozen=True)
class Topology:
    """Where this process trains: from torchslurm.init(), a process group set up by the caller, or
    a single local process."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    num_nodes: int
    local_world_size: int
    master: str


def topology(ctx: DistContext | None, environ: Mapping[str, str]) -> Topology:
    """From `ctx` when given; else from the caller's own process group and the torchrun variables
    in `environ` (LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); else one local process."""
    import torch
    import torch.distributed as dist

    if ctx is not None:
        env = ctx.env
        return Topology(ctx.rank, ctx.world_size, ctx.local_rank, ctx.device, ctx.backend, env.num_nodes,
                        env.local_world_size, f"{env.master_addr}:{env.master_port}")
    if dist.is_available() and dist.is_initialized():
        world, backend = dist.get_world_size(), str(dist.get_backend())
        local_world = int(environ.get("LOCAL_WORLD_SIZE", world))
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        master = f"{environ.get('MASTER_ADDR', '?')}:{environ.get('MASTER_PORT', '?')}"
        return Topology(dist.get_rank(), world, int(environ.get("LOCAL_RANK", 0)), device, backend,
                        max(1, world // local_world), local_world, master)
    return Topology(0, 1, 0, torch.device("cpu"), "none", 1, 1, "local")
