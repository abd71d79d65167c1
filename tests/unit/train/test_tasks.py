"""What a task measures: classification's accuracy, a language model's token loss and perplexity."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


class _Ops(TorchDispatchMode):
    """The aten ops run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("extra", [3, torch.tensor(3)])
def test_batch_sums_are_made_on_the_device_without_copying_a_number_in(extra: int | torch.Tensor) -> None:
    """An element assignment (`sums[2] = n`) copies the number from the host: on a GPU a blocking copy,
    the queue drained every batch. The sums come from fills and arithmetic on the loss's device."""
    loss = torch.tensor(0.5)
    with _Ops() as seen:
        sums = tasks.batch_sums(loss, 4, extra)
    assert sums.dtype == torch.float64 and sums.tolist() == [2.0, 3.0, 4.0]
    assert not {"aten.copy_", "aten.lift_fresh", "aten.index_put_"} & set(seen.ops), seen.ops
    meta = tasks.batch_sums(torch.empty((), device="meta"), torch.tensor(4), torch.empty((), device="meta"))
    assert meta.device.type == "meta" and meta.shape == (3,)
