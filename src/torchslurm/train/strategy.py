"""How the Trainer spreads the model over the ranks: DDP (a whole replica per rank, gradients
all-reduced) or FSDP2 (parameters, gradients and optimizer state sharded, see train.fsdp).

The loop asks the same four things of either: the module to call in training, a context for a
micro-step that must not synchronise gradients yet, gradient clipping, and whether every rank
must run the same number of forward passes (FSDP all-gathers parameters in each one)."""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from torchslurm.train import fsdp

if TYPE_CHECKING:
    from collections.abc import Iterator

    from torchslurm.train.config import TrainConfig
    from torchslurm.train.topology import Topology


class Strategy:
    """`config.strategy` applied to `model` (already on its device) and its `optimizer`."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig,
                 topo: Topology) -> None:
        self.kind = config.strategy if topo.world_size > 1 else "single"
        self.model = model
        self.module: nn.Module = model
        """What training calls: the DDP wrapper, or the sharded model itself."""
        if self.kind == "ddp":
            ids = [topo.device.index or 0] if topo.device.type == "cuda" else None
            self.module = DistributedDataParallel(model, device_ids=ids)
        elif self.kind == "fsdp":
            names = {id(p): name for name, p in model.named_parameters()}
            fsdp.shard_model(model, wrap=[n.strip() for n in config.fsdp_wrap.split(",") if n.strip()],
                             amp=config.amp, reshard_after_forward=config.fsdp_reshard_after_forward,
                             activation_checkpointing=config.activation_checkpointing)
            fsdp.rebind_optimizer(optimizer, names, model)

    @property
    def sharded(self) -> bool:
        return self.kind == "fsdp"

    @property
    def eval_module(self) -> nn.Module:
        """DDP: the plain module, so that evaluation runs no DDP hooks or collectives."""
        return self.model

    def accumulate(self, boundary: bool) -> AbstractContextManager[Any]:
        """The context of one micro-step's backward: gradients synchronise only on the boundary."""
        if boundary:
            return nullcontext()
        if isinstance(self.module, DistributedDataParallel):
            return self.module.no_sync()
        if self.sharded:
            return _no_gradient_sync(self.model)
        return nullcontext()

    def clip(self, max_norm: float) -> None:
        if self.sharded:
            fsdp.clip_grad_norm(self.model.parameters(), max_norm)
        else:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)


def make_scaler(amp: str, device_type: str) -> torch.amp.GradScaler:
    """amp=fp16's loss scaler, its scale on `device_type` (disabled, a pass-through, for off and bf16).

    The same scaler serves every strategy. Under FSDP2 each rank holds a DTensor shard of every
    gradient, so an inf or nan may sit in one rank's shard only; torch's DTensor rule for the
    unscale kernel (`_amp_foreach_non_finite_check_and_unscale_`) all-reduces found_inf with MAX
    over the gradients' device mesh, so all ranks skip the same steps and update the scale alike
    (tests/multiproc/test_fsdp.py puts an inf in one rank's shard)."""
    return torch.amp.GradScaler(device_type, enabled=amp == "fp16")


@contextmanager
def _no_gradient_sync(model: nn.Module) -> Iterator[None]:
    """FSDP2's no_sync: gradients stay unsharded and local until a backward with sync on."""
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]
