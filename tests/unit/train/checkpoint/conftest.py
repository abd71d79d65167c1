"""Helpers shared by the checkpoint tests. Import them as
`from tests.unit.train.checkpoint.conftest import linear_snapshot`."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from torchslurm.train import fsdp
from torchslurm.train.checkpoint.layout import FORMAT
from torchslurm.train.checkpoint.state import split_state
from torchslurm.train.checkpoint.writer import Snapshot
from torchslurm.train.models import GPT


def linear_snapshot(root: Path, step: int, keep_last: int) -> tuple[Snapshot, nn.Linear]:
    """A small model's checkpoint as one process takes it (no optimizer state yet), and the model."""
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    tensors, plain = split_state(model, optimizer)
    return Snapshot(root, step, tensors, {"rng": 1}, {"format": FORMAT, "optim_plain": plain}, keep_last), model


def sharded_gpt() -> tuple[nn.Module, torch.optim.Optimizer]:
    """A GPT sharded by FSDP2 over the one-rank group (the fixture one_rank_group), after one AdamW
    step of made-up gradients (FSDP's first backward in a process costs seconds)."""
    torch.manual_seed(0)
    model = GPT(vocab=16, block_size=8, dim=16, layers=1, heads=2)
    names = {id(p): name for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    fsdp.shard_model(model)
    fsdp.rebind_optimizer(optimizer, names, model)
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    optimizer.step()
    return model, optimizer
