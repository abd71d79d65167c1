"""How a batch becomes a loss and its sums: (input, target) pairs, dicts the Hugging Face way, a step of
your own; a batch the contract cannot serve stops with a message saying why."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from torchslurm.errors import ConfigError, UserCodeError
from torchslurm.train import tasks
from torchslurm.train.step import Stepper, StepResult, forward_keywords

cross_entropy = nn.functional.cross_entropy


@dataclass
class Output:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class HFLike(nn.Module):
    """A forward with keywords, returning a loss when given labels (the Hugging Face convention)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> Output:
        logits = self.linear(input_ids)
        return Output(logits, cross_entropy(logits, labels) if labels is not None else None)


class LogitsOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features)


def _stepper(loss_fn: Callable[..., torch.Tensor] | None = cross_entropy, step: Any = None,
             task: tasks.Task | None = None) -> Stepper:
    return Stepper(task or tasks.classification(), loss_fn, step, rank=0)


X, Y = torch.randn(6, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 0, 1, 2])


def test_a_pair_is_loss_fn_of_the_output_and_the_target() -> None:
    model = LogitsOnly()
    found = _stepper().forward(model, (X, Y))
    assert torch.equal(found.loss, cross_entropy(model(X), Y)) and found.n == 6
    assert torch.equal(_stepper().sums(found), tasks.classification().sums(model(X), Y, found.loss))
    assert _stepper().forward(model, [X, Y]).n == 6  # a list of two, as default collation of a list gives


def test_a_dict_takes_the_models_loss_and_leaves_out_keys_its_forward_does_not_take(
        caplog: pytest.LogCaptureFixture) -> None:
    model = HFLike()
    caplog.set_level("INFO", logger="torchslurm.train.step")
    found = _stepper(loss_fn=None).forward(model, {"input_ids": X, "labels": Y, "text": ["a"] * 6})
    assert torch.equal(found.loss, model(X, Y).loss) and found.n == 6
    assert found.output is not None and torch.equal(found.output, model(X).logits)  # accuracy counts from logits
    assert "batch keys text are not arguments of HFLike.forward: left out" in caplog.text
    assert forward_keywords(model) == {"input_ids", "labels"}


def test_a_dict_without_a_model_loss_uses_loss_fn_on_the_logits_and_labels() -> None:
    class Keywords(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def forward(self, **batch: torch.Tensor) -> dict[str, torch.Tensor]:  # takes every key
            return {"logits": self.linear(batch["features"])}

    model = Keywords()
    found = _stepper().forward(model, {"features": X, "labels": Y})
    assert torch.equal(found.loss, cross_entropy(model(features=X)["logits"], Y))
    with pytest.raises(ConfigError, match=r"a dict batch dict\(features=Tensor\[6, 4\]\): the model's output \(dict\) "
                                          r"has no loss, and the default step needs a labels tensor"):
        _stepper().forward(model, {"features": X})
    with pytest.raises(ConfigError, match=r"none of its keys is an argument of LogitsOnly.forward \(features\)"):
        _stepper().forward(LogitsOnly(), {"x": X, "labels": Y})


def test_a_step_of_your_own_returns_a_loss_or_the_loss_with_its_units_and_extra_sum() -> None:
    model = LogitsOnly()
    batch = (X, Y, torch.arange(6))  # (x, y, idx): no default for it

    def mean_loss(model: nn.Module, batch: Any) -> torch.Tensor:
        x, y, _ = batch
        return cross_entropy(model(x), y)

    def with_counts(model: nn.Module, batch: Any) -> StepResult:
        x, y, _ = batch
        logits = model(x)
        return StepResult(cross_entropy(logits, y), n=6, extra=(logits.argmax(1) == y).sum())

    found = _stepper(step=mean_loss).forward(model, batch)
    assert found.n == 6 and _stepper(step=mean_loss).sums(found).tolist() == [found.loss.item() * 6, 0.0, 6.0]
    counted = _stepper(step=with_counts).forward(model, batch)
    correct = int((model(X).argmax(1) == Y).sum())
    assert _stepper(step=with_counts).sums(counted)[1:].tolist() == [correct, 6.0]
    plain = _stepper(step=lambda m, b: (mean_loss(m, b), 12)).forward(model, batch)  # a plain tuple too
    assert plain.n == 12
    with pytest.raises(ConfigError, match=r"the step function returned dict\(loss=Tensor\[\]\); expected the batch's "
                                          r"loss \(a tensor\) or \(loss, n\)"):
        _stepper(step=lambda m, b: {"loss": mean_loss(m, b)}).forward(model, batch)


def test_a_batch_the_default_step_cannot_serve_says_what_it_got_and_how_to_pass_a_step() -> None:
    with pytest.raises(ConfigError, match=r"a batch of 3 items \(Tensor\[6, 4\], Tensor\[6\], Tensor\[6\]\): the "
                                          r"default step takes \(input, target\) pairs or dicts .*HINT: pass step= to "
                                          r"the Trainer, e.g. def step\(model, batch\): x, y, idx = batch"):
        _stepper().forward(LogitsOnly(), (X, Y, torch.arange(6)))
    with pytest.raises(ConfigError, match=r"a batch that is a Tensor\[6, 4\]"):
        _stepper().forward(LogitsOnly(), X)
    with pytest.raises(ConfigError, match=r"computes the loss of \(input, target\) batches with loss_fn, which is "):
        _stepper(loss_fn=None).forward(LogitsOnly(), (X, Y))


def test_a_loss_must_be_one_number_that_backward_can_run_on() -> None:
    def per_sample(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(output, target, reduction="none")

    with pytest.raises(ConfigError, match=r"the loss of a batch is Tensor\[6\]; expected a tensor of one number.*HINT: "
                                          r"reduce it \(loss.mean\(\)"):
        _stepper(per_sample).forward(LogitsOnly(), (X, Y))
    detached = _stepper(lambda output, target: cross_entropy(output, target).detach())
    with pytest.raises(ConfigError, match="the loss of a batch does not require grad"):
        detached.forward(LogitsOnly(), (X, Y))
    with torch.no_grad():
        assert detached.forward(LogitsOnly(), (X, Y), evaluating=True).n == 6  # evaluation needs no grad


def test_a_bug_in_the_users_code_is_theirs_and_torch_called_directly_names_torchs_line() -> None:
    with pytest.raises(UserCodeError, match=r"rank 0: loss_fn raised ValueError at .*functional.py:\d+ \(in "
                                            r"cross_entropy\): Expected input batch_size \(6\) to match target"):
        _stepper().forward(LogitsOnly(), (X, Y[:3]))
    with pytest.raises(UserCodeError, match=rf"rank 0: the model's forward raised RuntimeError at {__file__}:\d+ "
                                            r"\(in forward\): mat1 and mat2 shapes cannot be multiplied"):
        _stepper().forward(LogitsOnly(), (torch.ones(6, 5), Y))


def test_amp_bf16_runs_the_step_under_autocast() -> None:
    dtypes = []
    stepper = Stepper(tasks.classification(), lambda out, y: (dtypes.append(out.dtype), cross_entropy(out, y))[1],
                      None, 0, amp="bf16", device_type="cpu")
    stepper.forward(LogitsOnly(), (X, Y))
    with torch.no_grad():
        stepper.forward(LogitsOnly(), (X, Y), evaluating=True)
    assert dtypes == [torch.bfloat16, torch.float32]  # evaluation casts the logits to float32 first


def test_a_pair_whose_model_gives_several_outputs_counts_samples() -> None:
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.linear(x), self.linear(x).sum(dim=1)

    def loss_fn(outputs: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(outputs[0], target) + outputs[1].pow(2).mean()

    with torch.no_grad():
        found = _stepper(loss_fn).forward(TwoHeads(), (X, Y), evaluating=True)
    assert found.n == 6 and _stepper().sums(found).tolist() == [found.loss.item() * 6, 0.0, 6.0]
