"""The Trainer with your own model and data, in one process (no process group): dict batches the Hugging
Face way, (x, y, idx) batches with a step of your own, and the mistakes said clearly and early: a batch
the default step cannot serve, an optimizer on another module's parameters, a bug in your loss, a
run_dir trained with another model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from torchslurm.errors import CheckpointError, ConfigError, UserCodeError
from torchslurm.train.config import TrainConfig
from torchslurm.train.step import StepResult
from torchslurm.train.trainer import Trainer

pytestmark = pytest.mark.multiproc

X = torch.randn(96, 4, generator=torch.Generator().manual_seed(0))
Y = X[:, :3].argmax(dim=1)


class Dicts(Dataset[dict[str, Any]]):
    """Samples as dicts, with a string the model does not take (as tokenized datasets keep their text)."""

    def __len__(self) -> int:
        return len(X)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"features": X[i], "labels": Y[i], "text": f"sample {i}"}


@dataclass
class Output:
    logits: torch.Tensor
    loss: torch.Tensor | None


class Classifier(nn.Module):
    """Returns a loss when given labels, as a Hugging Face model does."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.linear = nn.Linear(4, classes)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> Output:
        logits = self.linear(features)
        return Output(logits, nn.functional.cross_entropy(logits, labels) if labels is not None else None)


def _config(run_dir: Path, **overrides: Any) -> TrainConfig:
    return TrainConfig(**{"epochs": 1, "batch_size": 16, "lr": 0.5, "run_dir": run_dir, "log_every": 0,
                          "straggler_every": 0, **overrides})


def test_dict_batches_train_with_the_models_own_loss_and_resume(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Classifier()
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.5), None, Dicts(), Dicts(), _config(tmp_path)).fit()
    again = Classifier()
    result = Trainer(again, torch.optim.SGD(again.parameters(), lr=0.5), None, Dicts(), Dicts(),
                     _config(tmp_path, epochs=2)).fit()
    assert result.global_step == 12 and result.val is not None and result.val.count == 96
    epochs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert epochs[0]["train_loss"] > epochs[1]["train_loss"] and epochs[1]["val_accuracy"] == result.val.accuracy > 0.5


def test_x_y_idx_batches_train_with_a_step_hook_and_stop_at_once_without_one(tmp_path: Path) -> None:
    data = TensorDataset(X, Y, torch.arange(96))
    seen: list[int] = []

    def step(model: nn.Module, batch: Any) -> StepResult:
        x, y, idx = batch
        seen.extend(idx.tolist())
        logits = model(x)
        return StepResult(nn.functional.cross_entropy(logits, y), n=len(y), extra=(logits.argmax(1) == y).sum())

    model = nn.Linear(4, 3)
    result = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.5), None, data, data, _config(tmp_path / "a"),
                     step=step).fit()
    assert sorted(seen[:96]) == list(range(96)) and result.val is not None and result.val.count == 96
    assert 0 < result.val.correct <= 96  # the step's own extra sum: accuracy without the default step
    without = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.5), nn.functional.cross_entropy, data, data,
                      _config(tmp_path / "b"))
    with pytest.raises(ConfigError, match=r"a batch of 3 items \[Tensor\[16, 4\], Tensor\[16\], Tensor\[16\]\]: the "
                                          r"default step takes \(input, target\) pairs or dicts"):
        without.fit()
    assert not (tmp_path / "b" / "checkpoints").exists() or not any((tmp_path / "b" / "checkpoints").iterdir())


def test_an_optimizer_on_another_modules_parameters_is_refused_when_the_trainer_is_built(tmp_path: Path) -> None:
    model, other = nn.Linear(4, 3), nn.Linear(4, 3)
    with pytest.raises(ConfigError, match=r"the optimizer holds 2 parameter tensor\(s\) and none of them is among the "
                                          r"parameters of the model given to the Trainer \(Linear"):
        Trainer(model, torch.optim.SGD(other.parameters(), lr=0.1), nn.functional.cross_entropy,
                TensorDataset(X, Y), TensorDataset(X, Y), _config(tmp_path))


def _buggy_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - nn.functional.one_hot(target[:3], 3)).pow(2).mean()  # the bug: a slice of the targets


def test_a_bug_in_your_loss_is_reported_as_yours_with_your_line(tmp_path: Path) -> None:
    model = nn.Linear(4, 3)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _buggy_loss, TensorDataset(X, Y),
                      TensorDataset(X, Y), _config(tmp_path))
    line = _buggy_loss.__code__.co_firstlineno + 1
    with pytest.raises(UserCodeError, match=rf"rank 0: loss_fn raised RuntimeError at {__file__}:{line} \(in "
                                            r"_buggy_loss\): The size of tensor a \(16\) must match"):
        trainer.fit()


def test_a_run_dir_trained_with_another_model_says_so_with_its_own_hint(tmp_path: Path) -> None:
    model = nn.Linear(4, 3)
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.functional.cross_entropy, TensorDataset(X, Y),
            TensorDataset(X, Y), _config(tmp_path)).fit()
    wider = nn.Linear(4, 5)
    other = Trainer(wider, torch.optim.SGD(wider.parameters(), lr=0.1), nn.functional.cross_entropy,
                    TensorDataset(X, Y), TensorDataset(X, Y), _config(tmp_path, epochs=2))
    with pytest.raises(CheckpointError) as caught:
        other.fit()
    assert "was saved from another model or optimizer (other shape: model.bias, model.weight" in caught.value.message
    assert caught.value.hint == ("resume with the model and optimizer it was trained with, or start over with "
                                 "resume=never or a new run_dir.")
