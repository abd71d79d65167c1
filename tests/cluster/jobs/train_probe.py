"""Cluster-test training rank: `torchslurm train`'s digits example (SimpleConvNet, Trainer, DDP),
then one record per rank with where it ran and what it ended with, so a test can check that
every rank agrees. Arguments are the same key=value settings `torchslurm train` takes."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch

import torchslurm
from torchslurm.train import config, data, models
from torchslurm.train.trainer import Trainer, seed_everything

DEFAULTS = {"epochs": 2, "batch_size": 32, "lr": 0.05, "log_every": 10}


def main(argv: list[str]) -> int:
    example, cfg = config.load(None, argv, DEFAULTS)
    with torchslurm.init() as ctx:
        train, val = data.load(example.dataset, example.data_dir, example.val_fraction, seed=0)
        seed_everything(cfg.seed)
        model = models.build(example.resolved_model, *data.describe(train))
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=example.momentum)
        result = Trainer(model, optimizer, torch.nn.functional.cross_entropy, train, val, cfg, ctx=ctx).fit()
        weights = float(sum(p.detach().double().sum() for p in model.parameters()))
        assert result.val is not None
        record = {"probe": 1, "rank": ctx.rank, "world_size": ctx.world_size, "local_rank": ctx.local_rank,
                  "host": socket.gethostname(), "launcher": ctx.env.launcher, "epochs_done": result.epochs_done,
                  "global_step": result.global_step, "val_loss_sum": result.val.loss_sum,
                  "val_correct": result.val.correct, "val_count": result.val.count, "val_size": len(val),
                  "weights_sum": weights}
    job, step = os.environ.get("SLURM_JOB_ID", "local"), os.environ.get("SLURM_STEP_ID", "x")
    Path(f"probe-{job}-{step}-{record['rank']}.json").write_text(json.dumps(record, sort_keys=True))
    print(f"train rank={record['rank']} host={record['host']} val={result.val.correct}/{result.val.count} "
          f"loss_sum={result.val.loss_sum:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
