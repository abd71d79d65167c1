"""The README's "Your own model" script, unchanged but for its run_dir and epochs (argv[1], argv[2]):
what a user of the Trainer API runs. Nothing here catches errors or signals."""

import logging
import sys

import torch
from torch.utils.data import TensorDataset

import torchslurm


def datasets():
    x = torch.randn(2000, 20)
    y = x[:, :3].argmax(dim=1)                         # a rule the model can learn
    return TensorDataset(x[:1600], y[:1600]), TensorDataset(x[1600:], y[1600:])


def main():
    logging.basicConfig(level=logging.INFO, format="%(message)s")   # show the Trainer's lines
    cfg = torchslurm.TrainConfig(epochs=int(sys.argv[2]), batch_size=64, lr=0.05, lr_scaling="linear",
                                 run_dir=sys.argv[1])
    with torchslurm.init() as ctx:                     # rank, device, backend, process group
        torchslurm.seed_everything(cfg.seed)           # same initial weights in every run
        model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
        train, val = datasets()
        result = torchslurm.Trainer(model, optimizer, torch.nn.functional.cross_entropy, train, val, cfg,
                                    ctx=ctx).fit()
        if ctx.is_main and not result.stopped_early:
            print(f"validation accuracy {100 * result.val.accuracy:.2f}%")
    return result.exit_code      # 75 when preempted: checkpoint saved, job requeued (see Preemption below)


if __name__ == "__main__":
    sys.exit(main())
