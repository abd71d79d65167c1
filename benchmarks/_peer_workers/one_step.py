"""The script benchmarks/launch.py times: initialise, take one DDP step on a tiny model, exit.

Runs the same under `torchslurm run --nproc 2` and under torchrun (torchslurm.init() reads
either launcher's environment).
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

import torchslurm


def main() -> None:
    with torchslurm.init() as ctx:
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(10, 2).to(ctx.device), device_ids=ctx.device_ids)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(torch.randn(8, 10, device=ctx.device)).square().mean()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
