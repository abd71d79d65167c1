"""(d) The Lightning Trainer: a LightningModule and trainer.fit, with logger, checkpointing, progress
bar and model summary off. Metrics go through self.log(..., sync_dist=True), Lightning's own way:
accumulated per step, reduced once at each epoch end."""

from __future__ import annotations

import os

import lightning as L
import torch
import torch.nn.functional as F
from common import LR, MOMENTUM, Outcome, Spec, StepClock, checkpoint_note, make_data, make_model
from torch import nn

ON = ("self.log of train loss and accuracy (on_epoch, sync_dist)", "validation every epoch (self.log, sync_dist)",
      "2 sanity validation steps before training (default)", "logger, per-epoch checkpoints (ModelCheckpoint), "
      "progress bar, model summary off")


class Classifier(L.LightningModule):
    def __init__(self, net: nn.Module, clock: StepClock) -> None:
        super().__init__()
        self.net, self.clock = net, clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output: torch.Tensor = self.net(x)
        return output

    def _metrics(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> torch.Tensor:
        inputs, targets = batch
        output = self(inputs)
        loss = F.cross_entropy(output, targets)
        accuracy = (output.argmax(dim=1) == targets).float().mean()
        self.log(f"{stage}_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log(f"{stage}_acc", accuracy, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._metrics(batch, "train")

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._metrics(batch, "val")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        optimizer = torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)
        self.clock.attach(optimizer)
        return optimizer


def train(spec: Spec, clock: StepClock) -> Outcome:
    local = int(os.environ["LOCAL_WORLD_SIZE"])
    world_size = int(os.environ["WORLD_SIZE"])
    train_set, val_set = make_data(spec, world_size)
    L.seed_everything(spec.seed, verbose=False)
    module = Classifier(make_model(spec.workload), clock)
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=local, num_nodes=world_size // local,
                        max_epochs=spec.epochs, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(train_set, batch_size=spec.batch_size, shuffle=True),
                torch.utils.data.DataLoader(val_set, batch_size=spec.batch_size))
    if spec.final_checkpoint:
        trainer.save_checkpoint(spec.checkpoint_path)
    clock.finish()
    return Outcome(trainer.global_rank, float(trainer.callback_metrics["val_acc"]),
                   ON + checkpoint_note(spec, "trainer.save_checkpoint after fit"))
