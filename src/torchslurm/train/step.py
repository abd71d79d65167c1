"""How a batch becomes a loss and its metric sums: your own `step(model, batch)`, or the default step.

The default step takes two kinds of batch (train.batches moved them to the device):

- `(input, target)` (a tuple or list of two): `loss = loss_fn(model(input), target)`;
- a dict, the Hugging Face shape: `output = model(**batch)`, with the keys that `model.forward` takes
  (all of them when it takes `**kwargs`; the others are left out). The loss is `output.loss` (or
  `output["loss"]`) when the model computed one (it does when given `labels`); else
  `loss_fn(logits, batch["labels"])`, the logits being the output itself when it is a tensor, or
  its `logits`.

Anything else — `(x, y, idx)`, several inputs, a loss that needs more than the output — takes a step of
your own: `step(model, batch)` returns the batch's mean loss, or `StepResult(loss, n, extra)` (a plain
`(loss, n)` or `(loss, n, extra)` tuple too) to say how many units the mean is over (tokens for a
per-token loss; default: the batch's samples, the length of its first tensor) and the task's second sum
(correct predictions for accuracy). The metric sums stay exact across ranks, and checkpoints,
preemption and FSDP do not depend on the step. The first batch the contract cannot serve stops the
run with a message saying why; an exception in the model, `loss_fn` or a step is reported as the
user's (train.usercode).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from torchslurm.errors import ConfigError
from torchslurm.train.batches import describe, samples
from torchslurm.train.strategy import unwrapped
from torchslurm.train.tasks import Task, batch_sums
from torchslurm.train.usercode import user_code

__all__ = ["Forward", "Step", "StepResult", "Stepper"]

logger = logging.getLogger(__name__)

_STEP_EXAMPLE = ("pass step= to the Trainer, e.g. def step(model, batch): x, y, idx = batch; "
                 "return loss_fn(model(x), y)  (docs/own-model.md)")


class StepResult(NamedTuple):
    """What a step of your own may return instead of a bare loss."""

    loss: torch.Tensor
    """The batch's mean loss over its `n` units (one number); the Trainer runs backward on it."""
    n: int | torch.Tensor | None = None
    """Units the mean is over (tokens for a per-token loss); None: the batch's samples."""
    extra: int | float | torch.Tensor = 0
    """The task's second sum (correct predictions, for accuracy); 0 when the task has none."""


Step = Callable[[nn.Module, Any], "torch.Tensor | StepResult | tuple[Any, ...]"]
"""`step(model, batch) -> loss` or `StepResult(loss, n, extra)`, batch already on the device."""


@dataclass(frozen=True)
class Forward:
    """One batch through the step: its loss and what its metric sums are made of."""

    loss: torch.Tensor
    n: int
    """Units in the batch (what the loss is the mean over)."""
    output: torch.Tensor | None = None
    """The logits, when the task computes its second sum from them and the target."""
    target: torch.Tensor | None = None
    extra: int | float | torch.Tensor = 0


class Stepper:
    """The step the Trainer runs on every batch, training and evaluation alike (train the module the
    strategy trains, evaluate its plain module)."""

    def __init__(self, task: Task, loss_fn: Callable[..., torch.Tensor] | None, step: Step | None,
                 rank: int, amp: str = "off", device_type: str = "cpu") -> None:
        self.task, self.loss_fn, self.step, self.rank = task, loss_fn, step, rank
        self.amp, self.device_type = amp, device_type
        self._keys: dict[int, frozenset[str] | None] = {}
        self._told = False

    def forward(self, model: nn.Module, batch: Any, evaluating: bool = False) -> Forward:
        """The batch's loss, under autocast when `amp` is on; evaluation casts logits to float32 first."""
        with self.autocast():
            if self.step is not None:
                found = self._own_step(model, batch)
            elif isinstance(batch, Mapping):
                found = self._dict_step(model, batch, evaluating)
            elif isinstance(batch, tuple | list) and len(batch) == 2:
                found = self._pair_step(model, batch[0], batch[1], evaluating)
            else:
                raise _unusable(batch)
        if not isinstance(found.loss, torch.Tensor) or found.loss.numel() != 1:
            raise ConfigError(f"the loss of a batch is {describe(found.loss)}; expected a tensor of one number, the "
                              "batch's mean.", "reduce it (loss.mean(), or reduction='mean' in the loss function).")
        if not evaluating and not found.loss.requires_grad:
            raise ConfigError("the loss of a batch does not require grad: backward cannot run on it.",
                              "compute it from the model's output, outside torch.no_grad() and without .detach().")
        return found

    def autocast(self) -> AbstractContextManager[Any]:
        """amp=bf16 or fp16: torch.autocast on this device; off: nothing."""
        if self.amp == "off":
            return nullcontext()
        return torch.autocast(self.device_type, dtype=torch.bfloat16 if self.amp == "bf16" else torch.float16)

    def sums(self, found: Forward) -> torch.Tensor:
        """[loss·n, extra, n] of one batch (train.metrics' exact sums)."""
        if found.output is not None and found.target is not None:
            return self.task.sums(found.output, found.target, found.loss)
        return batch_sums(found.loss, found.n, found.extra)

    # ---- the kinds of step ---------------------------------------------------------------------
    def _pair_step(self, model: nn.Module, inputs: Any, target: Any, evaluating: bool) -> Forward:
        loss_fn = self._need_loss_fn("(input, target) batches")
        with user_code(self.rank, "the model's forward"):
            output = model(inputs)
        if evaluating and isinstance(output, torch.Tensor):
            output = output.float()
        with user_code(self.rank, "loss_fn"):
            loss = loss_fn(output, target)
        if isinstance(output, torch.Tensor) and isinstance(target, torch.Tensor):
            return Forward(loss, self.task.count(target), output, target)
        return Forward(loss, samples((inputs, target)))  # e.g. a model of several outputs: no task sums of them

    def _dict_step(self, model: nn.Module, batch: Mapping[str, Any], evaluating: bool) -> Forward:
        kwargs = self._arguments(model, batch)
        with user_code(self.rank, "the model's forward"):
            output = model(**kwargs)
        loss, logits, labels = _part(output, "loss"), _logits(output), batch.get("labels")
        if evaluating and isinstance(logits, torch.Tensor):
            logits = logits.float()
        if not isinstance(loss, torch.Tensor):
            if not isinstance(labels, torch.Tensor) or not isinstance(logits, torch.Tensor):
                raise ConfigError(
                    f"a dict batch {describe(batch)}: the model's output ({type(output).__name__}) has no loss, and "
                    f"the default step needs {'logits' if 'labels' in batch else 'a labels tensor'} to compute one.",
                    "return a loss from the model when it gets labels (the Hugging Face convention), put the targets "
                    f"under 'labels', or {_STEP_EXAMPLE}.")
            loss_fn = self._need_loss_fn("dict batches whose model output has no loss")
            with user_code(self.rank, "loss_fn"):
                loss = loss_fn(logits, labels)
        if isinstance(labels, torch.Tensor):
            if isinstance(logits, torch.Tensor):
                return Forward(loss, self.task.count(labels), logits, labels)
            return Forward(loss, self.task.count(labels))
        return Forward(loss, samples(batch))

    def _own_step(self, model: nn.Module, batch: Any) -> Forward:
        assert self.step is not None
        with user_code(self.rank, "the step function"):
            returned = self.step(model, batch)
        if isinstance(returned, torch.Tensor):
            return Forward(returned, samples(batch))
        if isinstance(returned, tuple) and 1 <= len(returned) <= 3 and isinstance(returned[0], torch.Tensor):
            result = StepResult(*returned)
            n = samples(batch) if result.n is None else int(result.n)
            return Forward(result.loss, n, extra=result.extra)
        raise ConfigError(f"the step function returned {describe(returned)}; expected the batch's loss (a tensor) "
                          "or (loss, n) or (loss, n, extra).",
                          "return loss, or StepResult(loss, n=units the loss is the mean over, extra=correct).")

    def _need_loss_fn(self, what: str) -> Callable[..., torch.Tensor]:
        if self.loss_fn is None:
            raise ConfigError(f"the default step computes the loss of {what} with loss_fn, which is None.",
                              "pass loss_fn (e.g. torch.nn.functional.cross_entropy), or a step= of your own.")
        return self.loss_fn

    def _arguments(self, model: nn.Module, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The entries of `batch` that model.forward takes as keywords (all with **kwargs)."""
        if id(model) not in self._keys:
            self._keys[id(model)] = forward_keywords(model)
        accepted = self._keys[id(model)]
        if accepted is None:
            return dict(batch)
        kwargs = {key: value for key, value in batch.items() if key in accepted}
        name = type(unwrapped(model)).__name__
        if not kwargs:
            raise ConfigError(f"a dict batch {describe(batch)}: none of its keys is an argument of {name}.forward "
                              f"({', '.join(sorted(accepted)) or 'none by name'}).",
                              f"name the batch's keys after the forward's arguments, or {_STEP_EXAMPLE}.")
        if len(kwargs) < len(batch) and not self._told and self.rank == 0:
            self._told = True
            logger.info("batch keys %s are not arguments of %s.forward: left out",
                        ", ".join(sorted(set(batch) - set(kwargs))), name)
        return kwargs


def forward_keywords(model: nn.Module) -> frozenset[str] | None:
    """The names model.forward takes as keywords; None when it takes **kwargs (any name)."""
    parameters = inspect.signature(unwrapped(model).forward).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters
                     if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))


def _part(output: Any, name: str) -> Any:
    """output.<name> or output[<name>] (Hugging Face's ModelOutput has both); None when absent."""
    if isinstance(output, torch.Tensor):
        return None
    if isinstance(output, Mapping):
        return output.get(name)
    return getattr(output, name, None)


def _logits(output: Any) -> Any:
    return output if isinstance(output, torch.Tensor) else _part(output, "logits")


def _unusable(batch: Any) -> ConfigError:
    if isinstance(batch, tuple | list):
        what = f"a batch of {len(batch)} items {describe(batch)}"
    else:
        what = f"a batch that is a {describe(batch)}"
    return ConfigError(f"{what}: the default step takes (input, target) pairs or dicts (the Hugging Face shape, "
                       "with labels).", _STEP_EXAMPLE + ".")
