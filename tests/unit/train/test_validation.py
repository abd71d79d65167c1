"""One rank's part of a validation pass: its shard, exact sums, the random streams untouched, the
model back in training mode, a heartbeat per batch."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.functional import cross_entropy
from torch.utils.data import Dataset, TensorDataset

from torchslurm.train import tasks
from torchslurm.train.step import Stepper
from torchslurm.train.strategy import Strategy
from torchslurm.train.topology import Topology
from torchslurm.train.validation import Validator

X = torch.randn(11, 4, generator=torch.Generator().manual_seed(0))
Y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1])


class Augmented(Dataset[Any]):
    """Samples that draw from the global random stream when read, as a random augmentation does."""

    def __len__(self) -> int:
        return len(X)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return X[i] + 0 * torch.rand(4), Y[i]


def _validator(model: nn.Module, rank: int, world_size: int, beats: list[int]) -> Validator:
    topo = Topology(rank, world_size, 0, torch.device("cpu"), "gloo", 1, world_size, "local")
    stepper = Stepper(tasks.classification(), cross_entropy, None, rank=rank)
    return Validator(Strategy(model, topo), stepper, topo, batch_size=2, seed=0,
                     loading={"num_workers": 0, "pin_memory": False, "collate_fn": None},
                     beat=lambda: beats.append(1))


def test_a_rank_sums_exactly_its_shard_each_sample_once() -> None:
    torch.manual_seed(0)
    model, beats = nn.Linear(4, 3), []
    sums = _validator(model, rank=1, world_size=3, beats=beats).sums(TensorDataset(X, Y))
    mine = [1, 4, 7, 10]  # rank 1 of 3: every third sample from the second on, no padding
    with torch.no_grad():
        logits = model(X[mine])
        loss = cross_entropy(logits, Y[mine], reduction="sum")
        correct = (logits.argmax(1) == Y[mine]).sum()
    assert torch.allclose(sums, torch.tensor([float(loss), float(correct), 4.0], dtype=torch.float64))
    assert len(beats) == 2  # one per batch of 2
    assert model.training  # back to training mode


def test_the_random_streams_are_as_they_were_after_validation() -> None:
    validator = _validator(nn.Linear(4, 3), rank=0, world_size=1, beats=[])
    torch.manual_seed(3)
    before = torch.get_rng_state()
    validator.sums(Augmented())
    assert torch.equal(torch.get_rng_state(), before)


def test_validation_runs_the_model_in_evaluation_mode() -> None:
    seen: list[bool] = []
    model = nn.Linear(4, 3)
    model.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    _validator(model, rank=0, world_size=1, beats=[]).sums(TensorDataset(X, Y))
    assert seen == [False] * 6 and model.training
