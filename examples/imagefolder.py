"""A torchvision ResNet-18 on your own images, with the torchslurm Trainer.

    torchslurm run --nproc 4 examples/imagefolder.py --data-dir /data/pets amp=bf16
expects --data-dir/train/<class>/*.jpg and --data-dir/val/<class>/*.jpg. Needs torchvision
(pip install torchvision, the build matching your torch); without it this script says so and exits.
Settings: --epochs --batch-size --lr --data-dir --run-dir, --config FILE, key=value.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys

from torchslurm.cli.train import add_arguments, from_arguments
from torchslurm.errors import TorchSlurmError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_intermixed_args()
    if importlib.util.find_spec("torchvision") is None:
        print("error: examples/imagefolder.py needs torchvision, which is not installed. "
              "HINT: pip install torchvision (the build matching your torch).", file=sys.stderr)
        return 2
    defaults = {"dataset": "imagefolder", "model": "resnet18", "batch_size": 32, "run_dir": "runs/imagefolder"}
    example, cfg = from_arguments(args, defaults)
    assert example.data_dir is not None  # ExampleConfig requires it for dataset=imagefolder
    import torch

    import torchslurm
    from torchslurm.train import data, models
    from torchslurm.train.trainer import Trainer, seed_everything

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with torchslurm.init() as ctx:
        train, val = data.image_folder(example.data_dir)
        seed_everything(cfg.seed)
        model = models.build(example.resolved_model, *data.describe(train))
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=example.momentum)
        result = Trainer(model, optimizer, torch.nn.functional.cross_entropy, train, val, cfg, ctx=ctx).fit()
    return result.exit_code  # 75 after a preemption stop (checkpoint saved, job requeued)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TorchSlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
