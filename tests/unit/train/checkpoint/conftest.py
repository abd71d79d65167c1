"""Helpers shared by the checkpoint tests. Import them as
`from tests.unit.train.checkpoint.conftest import linear_snapshot`."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from torchslurm.train.checkpoint.layout import FORMAT
from torchslurm.train.checkpoint.state import split_state
from torchslurm.train.checkpoint.writer import Snapshot


def linear_snapshot(root: Path, step: int, keep_last: int) -> tuple[Snapshot, nn.Linear]:
    """A small model's checkpoint as one process takes it (no optimizer state yet), and the model."""
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    tensors, plain = split_state(model, optimizer)
    return Snapshot(root, step, tensors, {"rng": 1}, {"format": FORMAT, "optim_plain": plain}, keep_last), model
