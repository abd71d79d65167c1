"""How the Trainer spreads the model over the ranks: one process, DDP (a whole replica per rank,
gradients all-reduced) or FSDP2 (parameters, gradients and optimizer state sharded, see train.fsdp).

Each is a small class that owns its quirks; the loop asks the same things of every one: the module to
call in training and the one to evaluate with, a one-time settling before the first step, a context
for a micro-step that must not synchronise gradients yet, gradient clipping, evaluation padded to the
same number of forward passes on every rank, and whether its checkpointed state is replicated or
sharded. `make_strategy` is the one place the configured name is read."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sized
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset

from torchslurm.train import fsdp
from torchslurm.train.compiling import compile_in_place

if TYPE_CHECKING:
    from torchslurm.train.config import TrainConfig
    from torchslurm.train.topology import Topology

logger = logging.getLogger(__name__)


class Strategy:
    """One process: the model trains as it is."""

    state_form = "replicated"
    """How a checkpoint holds this strategy's model and optimizer: 'replicated' (whole tensors, written
    once) or 'sharded' (each rank its shard)."""
    syncs_in_backward = False
    """Whether gradients are synchronised by collectives that end inside backward (DDP): the time this
    rank waits for the others can then be timed there (train.steptime)."""

    def __init__(self, model: nn.Module, topo: Topology) -> None:
        self.model, self.topo = model, topo
        self.train_module: nn.Module = model
        """What training calls: the model, or its DDP wrapper."""

    @property
    def eval_module(self) -> nn.Module:
        """What evaluation calls: the plain module (DDP's hooks and collectives are for training)."""
        return self.model

    def settle(self, backward_once: Callable[[], None], optimizer: torch.optim.Optimizer) -> None:
        """Before the first step (and before the random streams are seeded or restored)."""

    def accumulate(self, boundary: bool) -> AbstractContextManager[Any]:
        """The context of one micro-step's backward: gradients synchronise only on the boundary."""
        return nullcontext()

    def clip(self, max_norm: float) -> None:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def pad_evaluation(self, data: Dataset[Any], batches_run: int, batch_size: int,
                       forward_one: Callable[[], object]) -> None:
        """After this rank evaluated its `batches_run` batches of `data`: what else every rank must run
        (`forward_one`: a forward pass of the evaluation step on a one-sample batch)."""


class DDP(Strategy):
    """A whole replica per rank; gradients all-reduced by DDP's hooks during backward."""

    syncs_in_backward = True

    def __init__(self, model: nn.Module, topo: Topology) -> None:
        super().__init__(model, topo)
        ids = [topo.device.index or 0] if topo.device.type == "cuda" else None
        self.train_module = DistributedDataParallel(model, device_ids=ids)

    def settle(self, backward_once: Callable[[], None], optimizer: torch.optim.Optimizer) -> None:
        """One throw-away forward/backward so DDP's bucket layout is final before the first real step.

        DDP reorders its gradient buckets after the first backward of a process. With more than 2
        ranks Gloo's ring all-reduce sums each element in an order set by its offset in the bucket,
        so the first step after a resume (old layout) would differ in the last bits from the same
        step of an uninterrupted run (new layout). Model state and gradients are put back after it."""
        saved = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        backward_once()
        optimizer.zero_grad(set_to_none=True)
        self.model.load_state_dict(saved)

    def accumulate(self, boundary: bool) -> AbstractContextManager[Any]:
        return nullcontext() if boundary else self.train_module.no_sync()  # type: ignore[operator]


class FSDP(Strategy):
    """FSDP2: each rank holds a shard of every parameter, its gradient and its optimizer state."""

    state_form = "sharded"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig,
                 topo: Topology) -> None:
        super().__init__(model, topo)
        names = {id(p): name for name, p in model.named_parameters()}
        fsdp.shard_model(model, wrap=[n.strip() for n in config.fsdp_wrap.split(",") if n.strip()],
                         amp=config.amp, reshard_after_forward=config.fsdp_reshard_after_forward,
                         activation_checkpointing=config.activation_checkpointing, compile=config.compile)
        fsdp.rebind_optimizer(optimizer, names, model)

    def accumulate(self, boundary: bool) -> AbstractContextManager[Any]:
        return nullcontext() if boundary else _no_gradient_sync(self.model)

    def clip(self, max_norm: float) -> None:
        fsdp.clip_grad_norm(self.model.parameters(), max_norm)

    def pad_evaluation(self, data: Dataset[Any], batches_run: int, batch_size: int,
                       forward_one: Callable[[], object]) -> None:
        """Each forward all-gathers the parameters: every rank runs as many as the rank with the most
        batches (the first), a one-sample dummy for each it lacks."""
        assert isinstance(data, Sized)
        most = math.ceil(math.ceil(len(data) / self.topo.world_size) / batch_size)
        for _ in range(most - batches_run):
            forward_one()


def make_strategy(model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig,
                  topo: Topology) -> Strategy:
    """`config.strategy` applied to `model` (already on its device) and its `optimizer`. One process trains
    the model as it is, except under fsdp in a process group (of one rank: one GPU, the same sharded
    checkpoints and mixed-precision policy as on many). compile=true compiles in place
    (train.compiling): FSDP its units, DDP its wrapper, one process the model."""
    if config.strategy == "fsdp" and (topo.world_size > 1 or _in_process_group()):
        return FSDP(model, optimizer, config, topo)
    strategy = Strategy(model, topo) if topo.world_size == 1 else DDP(model, topo)
    if config.compile:
        compile_in_place(strategy.train_module)
    return strategy


def _in_process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def unwrapped(model: nn.Module) -> nn.Module:
    """The user's module inside DDP's (or DataParallel's) and torch.compile's wrappers."""
    while True:
        if isinstance(model, DistributedDataParallel | torch.nn.DataParallel):
            model = model.module
        elif isinstance(inner := getattr(model, "_orig_mod", None), nn.Module):
            model = inner
        else:
            return model


def make_scaler(amp: str, device_type: str) -> torch.amp.GradScaler:
    """amp=fp16's loss scaler, its scale on `device_type` (disabled, a pass-through, for off and bf16).

    The same scaler serves every strategy. Under FSDP2 each rank holds a DTensor shard of every
    gradient, so an inf or nan may sit in one rank's shard only; torch's DTensor rule for the
    unscale kernel (`_amp_foreach_non_finite_check_and_unscale_`) all-reduces found_inf with MAX
    over the gradients' device mesh, so all ranks skip the same steps and update the scale alike
    (tests/multiproc/test_fsdp.py puts an inf in one rank's shard)."""
    return torch.amp.GradScaler(device_type, enabled=amp == "fp16")


def restore_scaler(scaler: torch.amp.GradScaler, saved: dict[str, Any]) -> bool:
    """Put a checkpoint's scaler state (`saved`: a GradScaler's state_dict, empty when that run had
    amp=off or bf16) into `scaler`; whether it was. The state is the same under every strategy (rank 0's
    state.pt), so it crosses DDP and FSDP. An amp=fp16 run resumed from a checkpoint without one starts
    from a fresh scale (torch's load_state_dict would refuse the empty state); a disabled scaler takes none."""
    if not scaler.is_enabled() or not saved:
        if scaler.is_enabled():
            logger.info("the checkpoint has no GradScaler state (it was saved without amp=fp16): "
                        "the loss scale starts afresh at %g", scaler.get_scale())
        return False
    scaler.load_state_dict(saved)
    return True


@contextmanager
def _no_gradient_sync(model: nn.Module) -> Iterator[None]:
    """FSDP2's no_sync: gradients stay unsharded and local until a backward with sync on."""
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]
