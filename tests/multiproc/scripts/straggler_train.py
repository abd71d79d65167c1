"""A Trainer run on every rank, twice: `healthy` (every rank sleeps SLEEP_S per forward, a steady
stand-in for GPU work that CPU contention does not blur) and `slow` (rank SLOW_RANK sleeps three times
as long). argv: RUN_ROOT SLOW_RANK. Run with `torchslurm run --nproc N`."""

import logging
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

import torchslurm

SLEEP_S = 0.05


class Sleepy(torch.nn.Module):
    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.sleep_s, self.net = sleep_s, torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.sleep_s)
        return self.net(x)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root, slow_rank = Path(sys.argv[1]), int(sys.argv[2])
    x = torch.randn(360, 8)  # 30 steps of 4 samples on each of 3 ranks
    train, val = TensorDataset(x, (x[:, 0] > 0).long()), TensorDataset(x[:12], (x[:12, 0] > 0).long())
    with torchslurm.init() as ctx:
        for name, slow in (("healthy", -1), ("slow", slow_rank)):
            cfg = torchslurm.TrainConfig(epochs=1, batch_size=4, lr=0.01, run_dir=root / name, resume="never",
                                         log_every=5, straggler_every=5, straggler_window=3)
            torch.manual_seed(0)
            model = Sleepy(SLEEP_S * (3 if ctx.rank == slow else 1))
            optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
            torchslurm.Trainer(model, optimizer, torch.nn.functional.cross_entropy, train, val, cfg, ctx=ctx).fit()


if __name__ == "__main__":
    main()
