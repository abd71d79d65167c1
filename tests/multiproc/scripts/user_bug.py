"""Every rank's loss function has a shape bug (a RuntimeError inside torch, as real shape bugs are): the
run must end with each rank's own UserCodeError naming this file's line, not with a distributed failure.
Started as a rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set); argv[1] is the run_dir."""

import sys

import torch
from torch.utils.data import TensorDataset

import torchslurm


def loss_fn(output, target):
    return (output - target[:3, None]).pow(2).mean()  # the bug: a slice of the targets


def main():
    cfg = torchslurm.TrainConfig(epochs=1, batch_size=8, run_dir=sys.argv[1], resume="never")
    with torchslurm.init(timeout_s=20) as ctx:
        data = TensorDataset(torch.randn(32, 4), torch.randn(32))
        model = torch.nn.Linear(4, 2)
        torchslurm.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn, data, data, cfg,
                           ctx=ctx).fit()


if __name__ == "__main__":
    main()
