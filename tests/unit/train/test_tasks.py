"""What a task measures: classification's accuracy, a language model's token loss and perplexity."""

from __future__ import annotations

import pytest
import torch

from torchslurm.train import tasks
from torchslurm.train.metrics import Totals


def test_classification_and_language_model_sums() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    sums = tasks.classification().sums(logits, torch.tensor([0, 0, 0]), torch.tensor(0.5))
    assert sums.tolist() == [1.5, 2.0, 3.0]
    lm = tasks.language_model(flops_per_token=10.0)
    sums = lm.sums(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), torch.tensor(2.0))
    assert sums.tolist() == [12.0, 0.0, 6.0]
    assert lm.metrics(Totals(12.0, 0, 6)) == pytest.approx({"loss": 2.0, "perplexity": 7.389056})
    assert lm.summary(Totals(12.0, 0, 6)) == "Avg Loss: 2.000000, Perplexity: 7.389"
    assert tasks.classification().summary(Totals(3.0, 2, 4)) == "Avg Loss: 0.750000, Accuracy: 50.00%"
