"""Builds a DDP model, uses only the unwrapped module, all_reduces once, leaves `torchslurm.init()`."""

import torch
from torch.nn.parallel import DistributedDataParallel

import torchslurm
from torchslurm.models import SimpleConvNet

with torchslurm.init() as ctx:
    model = SimpleConvNet(8)
    ddp = DistributedDataParallel(model)
    with torch.no_grad():
        model(torch.randn(32, 1, 8, 8))
    torch.distributed.all_reduce(torch.ones(1))
