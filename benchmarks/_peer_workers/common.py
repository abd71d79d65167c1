"""What every peer worker shares: the run's settings, the two workloads, and the step clock.

Every framework trains the same model on the same data with the same seed, batch size and
optimizer; only the training loop around them differs. The clock is a post-step hook on the
plain torch optimizer, so it stamps the same moment (just after `optimizer.step()` returned)
whichever framework wraps the optimizer or calls its step.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

WORKLOADS = {
    "conv": "SimpleConvNet (2 conv + 2 linear, dropout), 1×28×28 synthetic images, 10 classes: compute-bound",
    "mlp": "MLP 10→50→10, synthetic features, 10 classes: overhead-bound",
}
LR, MOMENTUM = 0.05, 0.9
NUM_CLASSES = 10


@dataclass(frozen=True)
class Spec:
    """One worker's run, as the harness asks for it."""

    framework: str
    workload: str
    epochs: int
    """Epochs, each ending in a validation pass."""
    steps: int
    """Optimizer steps per epoch (the data is sized for exactly this many batches per rank)."""
    batch_size: int
    """Samples per rank per step."""
    seed: int
    out: Path
    """Rank 0 writes its record here (JSON)."""
    scratch: Path
    """A fresh directory all ranks of this run share (run_dir, logs)."""
    final_checkpoint: bool = False
    """Write one resumable checkpoint (model and optimizer) after the last epoch, the framework's way."""

    @property
    def checkpoint_path(self) -> Path:
        return self.scratch / "final-checkpoint"


def parse_spec(argv: Sequence[str] | None = None) -> Spec:
    parser = argparse.ArgumentParser(description="One peer worker (started by benchmarks/peers.py under torchrun).")
    parser.add_argument("framework")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scratch", type=Path, required=True)
    parser.add_argument("--final-checkpoint", action="store_true")
    args = parser.parse_args(argv)
    return Spec(args.framework, args.workload, args.epochs, args.steps, args.batch_size, args.seed, args.out,
                args.scratch, args.final_checkpoint)


class ConvNet(nn.Module):
    """The layers of torchslurm's SimpleConvNet(28) (the classic MNIST net): 9216 features after pooling."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(64 * 12 * 12, 128)
        self.dropout2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        x = self.dropout1(torch.max_pool2d(x, 2))
        x = self.dropout2(torch.relu(self.fc1(torch.flatten(x, 1))))
        logits: torch.Tensor = self.fc2(x)
        return logits


def make_model(workload: str) -> nn.Module:
    """A fresh model; call it right after seeding so every framework starts from the same weights."""
    if workload == "conv":
        return ConvNet()
    return nn.Sequential(nn.Linear(10, 50), nn.ReLU(), nn.Linear(50, NUM_CLASSES))


def make_data(spec: Spec, world_size: int) -> tuple[TensorDataset, TensorDataset]:
    """In-memory (train, val) data from the seed: exactly `steps` full batches per rank per epoch, and a
    quarter as many for validation. Labels are the argmax of a fixed random projection (learnable)."""
    shape = (1, 28, 28) if spec.workload == "conv" else (10,)
    per_batch = spec.batch_size * world_size
    n_train, n_val = spec.steps * per_batch, max(1, spec.steps // 4) * per_batch
    generator = torch.Generator().manual_seed(spec.seed)
    inputs = torch.randn((n_train + n_val, *shape), generator=generator)
    projection = torch.randn((inputs[0].numel(), NUM_CLASSES), generator=generator)
    labels = (inputs.flatten(1) @ projection).argmax(dim=1)
    return TensorDataset(inputs[:n_train], labels[:n_train]), TensorDataset(inputs[n_train:], labels[n_train:])


@dataclass
class StepClock:
    """perf_counter stamps: process start, after every optimizer step, and the end of the run."""

    process_start: float
    steps: list[float] = field(default_factory=list)
    end: float = 0.0

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Stamp after every `optimizer.step()` (a torch post-step hook on the plain optimizer)."""
        optimizer.register_step_post_hook(lambda *_: self.steps.append(time.perf_counter()))

    def finish(self) -> None:
        """The run is over: the last epoch's validation and epoch-end work are done."""
        self.end = time.perf_counter()


@dataclass(frozen=True)
class Outcome:
    """What a framework's worker hands back besides the clock."""

    rank: int
    val_accuracy: float
    """Final validation accuracy (a sanity check that every loop really trained)."""
    on: Sequence[str]
    """What this variant does besides the bare step: metrics, validation, logging, checkpoints."""


def checkpoint_note(spec: Spec, how: str) -> tuple[str, ...]:
    """The `on` entry for the final checkpoint: how this framework writes it, or that it writes none."""
    return (f"final checkpoint: {how}",) if spec.final_checkpoint else ("no checkpoints",)


def write_record(spec: Spec, clock: StepClock, outcome: Outcome) -> None:
    """Rank 0 writes the run's stamps and facts as JSON (other ranks write nothing)."""
    if outcome.rank != 0:
        return
    record: dict[str, Any] = {
        "framework": spec.framework, "workload": spec.workload, "epochs": spec.epochs, "steps_per_epoch": spec.steps,
        "batch_size": spec.batch_size, "seed": spec.seed, "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "threads": torch.get_num_threads(), "process_start": clock.process_start, "step_stamps": clock.steps,
        "end": clock.end, "val_accuracy": outcome.val_accuracy, "on": list(outcome.on),
        "final_checkpoint": spec.final_checkpoint,
    }
    spec.out.write_text(json.dumps(record))
