"""A Trainer-style flow: the DDP model lives in a function that returns before init() exits."""

import torch
from torch.nn.parallel import DistributedDataParallel

import torchslurm
from torchslurm.train.models import SimpleConvNet


def evaluate_once() -> float:
    model = SimpleConvNet(8)
    ddp = DistributedDataParallel(model)
    ddp.eval()  # a reference cycle through the module tree: only the garbage collector frees it
    with torch.no_grad():
        total = model(torch.randn(32, 1, 8, 8)).sum().reshape(1)
    torch.distributed.all_reduce(total)
    return float(total.item())


with torchslurm.init() as ctx:
    evaluate_once()
