"""What a model is trained to do, as far as the metrics care: which sums a batch adds, what they
mean, and what one unit of throughput is.

Every task keeps the exact-metrics layout of train.metrics: per batch a float64 vector
[loss·n, extra, n] summed over the ranks; `n` counts the task's units (samples, or tokens) and
`extra` is the task's own count (correct predictions for a classifier). A task of your own:

    Task("regression", unit="samples", metrics=lambda t: {"loss": t.avg_loss, "rmse": t.avg_loss ** 0.5})
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from torchslurm.train.metrics import Totals


def _samples(target: torch.Tensor) -> int:
    return int(target.shape[0])


def _argmax_hits(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor | int:
    if output.dim() == 2 and target.dim() == 1:
        return (output.argmax(dim=1) == target).sum()
    return 0


@dataclass(frozen=True)
class Task:
    """How batches become metrics."""

    name: str
    metrics: Callable[[Totals], dict[str, float]]
    """Named metrics of summed totals; "loss" first. They appear as train_<name> and val_<name>."""
    unit: str = "samples"
    """What `n` counts: the throughput unit of the progress line (samples/s, tokens/s)."""
    count: Callable[[torch.Tensor], int] = _samples
    """Units in a batch, from its target (from shapes: no device sync)."""
    extra: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | int] | None = None
    """The second sum of a batch (e.g. correct predictions); None: 0."""
    flops_per_unit: float = 0.0
    """Estimated training FLOPs (forward + backward) per unit; 0: no FLOP/s reported."""

    def sums(self, output: torch.Tensor, target: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        """[loss·n, extra, n] for one batch, float64 on the batch's device (no sync). `loss` is the
        batch mean over its units."""
        return batch_sums(loss, self.count(target), self.extra(output, target) if self.extra is not None else 0)

    def summary(self, totals: Totals) -> str:
        """The epoch line's metrics, e.g. 'Avg Loss: 0.123456, Accuracy: 97.50%'."""
        parts = [f"Avg Loss: {totals.avg_loss:.6f}"]
        for name, value in self.metrics(totals).items():
            if name == "accuracy":
                parts.append(f"Accuracy: {100 * value:.2f}%")
            elif name != "loss":
                parts.append(f"{name.capitalize()}: {value:.4g}")
        return ", ".join(parts)


def batch_sums(loss: torch.Tensor, n: int | torch.Tensor, extra: torch.Tensor | int | float = 0) -> torch.Tensor:
    """[loss·n, extra, n] of one batch whose mean loss over its `n` units is `loss`: float64 on the
    loss's device, without a device sync. (Numbers become tensors by a fill on the device: assigning one
    to an element of a CUDA tensor, `sums[1] = n`, copies it from the host and waits for the GPU's
    queue to drain, every batch, so that the next step cannot be queued while this one runs.)"""
    weighted = loss.detach().double() * n
    return torch.stack([weighted, _on_device(extra, weighted), _on_device(n, weighted)])


def _on_device(value: torch.Tensor | int | float, like: torch.Tensor) -> torch.Tensor:
    """`value` as a float64 number on `like`'s device."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(like.device, torch.float64).reshape(())
    return torch.full((), value, dtype=torch.float64, device=like.device)


def classification() -> Task:
    """Logits (N, classes) against class indices (N,): loss and accuracy per sample."""
    return Task("classification", lambda t: {"loss": t.avg_loss, "accuracy": t.accuracy}, extra=_argmax_hits)


def _tokens(target: torch.Tensor) -> int:
    return int(target.numel())


def _perplexity(totals: Totals) -> dict[str, float]:
    return {"loss": totals.avg_loss, "perplexity": math.exp(min(totals.avg_loss, 700.0))}


def language_model(flops_per_token: float = 0.0) -> Task:
    """Logits (N, T, vocab) against next tokens (N, T): loss per token and perplexity; tokens/s."""
    return Task("language_model", _perplexity, unit="tokens", count=_tokens, flops_per_unit=flops_per_token)


def loss_only() -> Task:
    """Loss per sample and nothing else."""
    return Task("loss", lambda t: {"loss": t.avg_loss})


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over every token of (N, T, vocab) logits and (N, T) targets."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
