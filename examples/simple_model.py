"""SimpleModel (10→50→2) trained with DDP on synthetic data, via the torchslurm Trainer.

    python examples/simple_model.py                      # one process
    torchslurm run --nproc 2 examples/simple_model.py    # 2 local ranks (Gloo on CPU)
    srun python examples/simple_model.py                 # in an sbatch script (NCCL on GPUs)
Settings: --epochs --batch-size --lr --run-dir, --config FILE, key=value.
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch

import torchslurm
from torchslurm.cli.train import add_arguments, from_arguments
from torchslurm.errors import TorchSlurmError
from torchslurm.train import data
from torchslurm.train.models import SimpleModel
from torchslurm.train.trainer import Trainer, seed_everything


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    defaults = {"dataset": "synthetic", "epochs": 5, "batch_size": 64, "lr": 0.05, "run_dir": "runs/simple_model"}
    _, cfg = from_arguments(parser.parse_intermixed_args(), defaults)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with torchslurm.init() as ctx:
        train, val = data.synthetic(num_samples=4096, shape=(10,), num_classes=2, seed=0)
        seed_everything(cfg.seed)
        model = SimpleModel()
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
        result = Trainer(model, optimizer, torch.nn.functional.cross_entropy, train, val, cfg, ctx=ctx).fit()
        if ctx.is_main and result.val is not None and not result.stopped_early:
            print(f"final validation accuracy {100 * result.val.accuracy:.2f}%; outputs in {cfg.run_dir}")
    return result.exit_code  # 75 after a preemption stop (checkpoint saved, job requeued)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TorchSlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
