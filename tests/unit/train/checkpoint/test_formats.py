"""Every checkpoint format an earlier release wrote still loads: the Trainer resumes from a copy of each
fixture in tests/fixtures/checkpoints (made by its make.py) and has the weights, optimizer state and
position recorded beside it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchslurm.train.trainer import TrainConfig, Trainer

FIXTURES = Path(__file__).parents[3] / "fixtures" / "checkpoints"
FORMATS = sorted(path.name for path in FIXTURES.iterdir() if (path / "expected.json").is_file())


def test_there_is_a_fixture_of_each_format() -> None:
    assert FORMATS == ["format1", "format2-shards", "format2-tensors"]


@pytest.mark.parametrize("name", FORMATS)
def test_a_checkpoint_of_an_earlier_release_resumes(name: str, tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / name, tmp_path / "checkpoints", ignore=shutil.ignore_patterns("expected.json"))
    expected = json.loads((FIXTURES / name / "expected.json").read_text())
    torch.manual_seed(1)  # other initial weights than the fixture's run
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = TensorDataset(torch.randn(8, 3), torch.tensor([0, 1] * 4))
    config = TrainConfig(epochs=1, batch_size=4, lr=0.1, run_dir=tmp_path, log_every=0)
    trainer = Trainer(model, optimizer, nn.functional.cross_entropy, data, data, config, environ={})
    result = trainer.fit()  # resumes, finds the one epoch done, validates
    assert (result.epochs_done, result.global_step) == (expected["epoch"], expected["global_step"])
    assert model.weight.tolist() == expected["weight"] and model.bias.tolist() == expected["bias"]
    assert [optimizer.state[p]["momentum_buffer"].tolist() for p in model.parameters()] == expected["momentum"]
