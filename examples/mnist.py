"""MNIST training (SimpleConvNet, DDP) with the torchslurm Trainer.

The same file runs anywhere, unchanged:
    python examples/mnist.py --data-dir data/mnist                     # one process
    torchslurm run --nproc 2 examples/mnist.py --data-dir data/mnist    # 2 local ranks
    torchrun --nproc-per-node 2 examples/mnist.py --data-dir data/mnist
    srun python examples/mnist.py --data-dir data/mnist                 # inside an sbatch script
MNIST is read from the four IDX files in --data-dir (default ./data, no download). Without them,
`dataset=digits` trains the 8×8 variant on scikit-learn's bundled digits.
Settings: --epochs --batch-size --lr --data-dir --run-dir, --config cfg.yaml|cfg.toml, and key=value
(e.g. amp=bf16 resume=never).
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
from torchslurm.train.models import SimpleConvNet
from torchslurm.train.trainer import Trainer, seed_everything


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    # the demo's lr and batch size: with TrainConfig's generic lr=0.01 and batch 64, 5 epochs of the
    # 1,437 digits training images are only ~230 SGD steps, which end near 70 % accuracy
    defaults = {"dataset": "mnist", "data_dir": "data", "run_dir": "runs/mnist", "lr": 0.05, "batch_size": 32}
    example, cfg = from_arguments(parser.parse_intermixed_args(), defaults)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with torchslurm.init() as ctx:
        train, val = data.load(example.dataset, example.data_dir, example.val_fraction)
        seed_everything(cfg.seed)
        model = SimpleConvNet(image_size=28 if example.dataset == "mnist" else 8)
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=example.momentum)
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
