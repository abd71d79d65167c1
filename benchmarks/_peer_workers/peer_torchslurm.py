"""(b) The torchslurm Trainer, driven as examples/simple_model.py drives it, with the cheapest
reporting a user would pick for a benchmark: progress lines off (log_every=0) and checkpoints only
at the end (checkpoint_every_epochs=0; the other peers write none). Everything else is the default."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from common import LR, MOMENTUM, Outcome, Spec, StepClock, make_data, make_model

import torchslurm

ON = ("exact train metrics per batch, 1 all_reduce per epoch", "validation every epoch (exact, 1 all_reduce)",
      "rank-0 epoch log lines, metrics.jsonl + TensorBoard events every epoch (always on)",
      "curves.png drawn once after the last epoch, off the training path (always on)",
      "one checkpoint after the last epoch (checkpoint_every_epochs=0; per-epoch ones off)",
      "progress lines off (log_every=0)", "preemption signal handling + dead-peer watchdog (defaults)",
      "one untimed DDP bucket-settling forward/backward before the first step")


def train(spec: Spec, clock: StepClock) -> Outcome:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with torchslurm.init() as ctx:
        train_set, val_set = make_data(spec, ctx.world_size)
        torchslurm.seed_everything(spec.seed)
        model = make_model(spec.workload)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        clock.attach(optimizer)
        config = torchslurm.TrainConfig(epochs=spec.epochs, batch_size=spec.batch_size, lr=LR, seed=spec.seed,
                                        run_dir=spec.scratch / "run", log_every=0, checkpoint_every_epochs=0)
        result = torchslurm.Trainer(model, optimizer, F.cross_entropy, train_set, val_set, config, ctx=ctx).fit()
        clock.finish()
        accuracy = result.val.accuracy if result.val is not None else float("nan")
        return Outcome(ctx.rank, accuracy, ON)
