"""FSDP2 for the Trainer and for a loop of your own: which modules become sharded units, the
mixed-precision policy, activation checkpointing, the optimizer re-pointed at the sharded
parameters, and the clipping of a sharded gradient norm.

    model = shard_model(model, wrap=("Block",), amp="bf16")      # after torchslurm.init()
    optimizer = torch.optim.AdamW(model.parameters())            # or rebind_optimizer(optimizer, names)

`fully_shard` replaces every parameter by a new `nn.Parameter` holding a DTensor shard (dim 0
split over the ranks), so an optimizer built before sharding must be re-pointed; the Trainer does
it with `rebind_optimizer`.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from torchslurm.errors import ConfigError, not_one_of
from torchslurm.train.compiling import compile_in_place

logger = logging.getLogger(__name__)

MIN_SHARE = 0.1
"""Default: a child module becomes its own sharded unit when it holds this share of the parameters."""
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)
_STACKS = (nn.ModuleList, nn.Sequential)
"""The containers that hold a model's layers in order: GPT's `blocks`, nn.TransformerEncoder's and
nn.TransformerDecoder's `layers`, ResNet's `layer1`..`layer4`, a Sequential of blocks."""


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _layers(module: nn.Module) -> list[nn.Module]:
    """The layers of a stack: the children of a ModuleList or Sequential whose class comes more than
    once among its children with parameters (the blocks, not the embedding or head beside them)."""
    if not isinstance(module, _STACKS):
        return []
    children = [m for m in module.children() if _count(m) > 0]
    classes = Counter(type(m) for m in children)
    return [m for m in children if classes[type(m)] > 1]


def units(model: nn.Module, wrap: Sequence[str] = (), min_share: float = MIN_SHARE) -> list[nn.Module]:
    """The modules to shard one by one before the root (pure: nothing is changed).

    With `wrap` (class names): every module of those classes, outermost first. Without: walking
    down from the root, the layers of every layer stack (`_layers`) that together hold at least
    `min_share` of the parameters, each its own unit however small; every other child holding at
    least `min_share`. A container, or a module holding a layer stack (nn.TransformerEncoder and its
    `layers`), is looked into instead of taken whole."""
    if wrap:
        wanted = set(wrap)
        found = [m for m in model.modules() if m is not model and type(m).__name__ in wanted]
        missing = wanted - {type(m).__name__ for m in found}
        if missing:
            classes = sorted({type(m).__name__ for m in model.modules() if m is not model})
            raise ConfigError(f"fsdp_wrap={','.join(wrap)}: no module of class {', '.join(sorted(missing))} in "
                              f"{type(model).__name__}; its classes are {', '.join(classes)}.",
                              "name classes of the model's repeated blocks, e.g. fsdp_wrap=Block, or leave "
                              "fsdp_wrap empty to shard by parameter share.")
        # a module inside another chosen one is still sharded: fully_shard nests
        return found
    chosen: list[nn.Module] = []
    _choose(model, min_share * _count(model), chosen)
    return chosen


def _choose(parent: nn.Module, threshold: float, chosen: list[nn.Module]) -> None:
    """Add `parent`'s units to `chosen`, in the order of its children (see `units`)."""
    layers = _layers(parent)
    if sum(_count(m) for m in layers) < threshold:
        layers = []
    for child in parent.children():
        if any(child is layer for layer in layers):
            chosen.append(child)
        elif isinstance(child, _CONTAINERS) or any(_layers(grandchild) for grandchild in child.children()):
            _choose(child, threshold, chosen)
        elif _count(child) >= threshold and _count(child) > 0:
            chosen.append(child)


def mixed_precision(amp: str) -> object | None:
    """FSDP2's policy for the Trainer's `amp`: bf16 or fp16 parameters in forward/backward; gradients
    are reduced in fp32 (a bf16 or fp16 reduce-scatter sums W values and loses bits, in fp16 also range,
    that the fp32 shard of the optimizer would keep). The gradient shards stay fp32, the parameters'
    own dtype, which is what amp=fp16's GradScaler unscales (it refuses fp16 gradients)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if amp == "off":
        return None
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    if amp not in dtypes:
        raise not_one_of("amp", amp, ("off", *dtypes))
    return MixedPrecisionPolicy(param_dtype=dtypes[amp], reduce_dtype=torch.float32)


def shard_model(model: nn.Module, *, wrap: Sequence[str] = (), amp: str = "off",
                reshard_after_forward: bool = True, activation_checkpointing: bool = False,
                min_share: float = MIN_SHARE, compile: bool = False) -> nn.Module:
    """`fully_shard` every unit of `units()` (with activation checkpointing when asked), then the
    root, over all ranks of the default process group; returns `model` itself (sharded in place).
    `compile`: then torch.compile each unit in place (the root too when there is no unit).
    Call it on every rank, after the process group exists and the model is on its device."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError("strategy=fsdp needs a process group, and there is none.",
                          "call torchslurm.init() (or dist.init_process_group) first.")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = mixed_precision(amp)
    options = {"mesh": mesh, "reshard_after_forward": reshard_after_forward,
               **({"mp_policy": policy} if policy is not None else {})}
    chosen = units(model, wrap, min_share)
    classes = ", ".join(sorted({type(m).__name__ for m in chosen})) or "root only"  # before fully_shard renames them
    for module in chosen:
        if activation_checkpointing:
            from torch.distributed._composable.checkpoint_activation import checkpoint

            checkpoint(module)
        fully_shard(module, **options)  # type: ignore[call-overload]
    fully_shard(model, **options)  # type: ignore[call-overload]
    if compile:
        for module in chosen or [model]:
            compile_in_place(module)
    if dist.get_rank() == 0:  # the same on every rank: said once
        logger.info("FSDP: %d sharded unit%s + root over %d ranks (%s)", len(chosen),
                    "s" if len(chosen) != 1 else "", dist.get_world_size(), classes)
    return model


def rebind_optimizer(optimizer: torch.optim.Optimizer, names: dict[int, str], model: nn.Module) -> None:
    """Point `optimizer` at `model`'s sharded parameters. `names` maps id(old parameter) to its name,
    taken before sharding; the optimizer must not have stepped yet."""
    if optimizer.state:
        raise ConfigError("the optimizer has state already (it stepped before sharding), so it cannot be moved "
                          "to the FSDP-sharded parameters.",
                          "build the optimizer fresh and give it to the Trainer before any step.")
    now = dict(model.named_parameters())
    for group in optimizer.param_groups:
        try:
            group["params"] = [now[names[id(p)]] for p in group["params"]]
        except KeyError as exc:
            raise ConfigError("the optimizer holds a parameter that is not the model's.",
                              "build the optimizer from model.parameters().") from exc


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> float:
    """Clip the global 2-norm of sharded (DTensor) gradients to `max_norm`; the norm before clipping.

    Each rank sums the squares of its own shards, one all_reduce adds them: every element of a
    FSDP-sharded gradient lives on exactly one rank."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in parameters if p.grad is not None]
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    device = local[0].device if local else torch.device("cpu")
    squares = torch.zeros((), dtype=torch.float64, device=device)
    for g in local:
        squares += g.detach().double().pow(2).sum()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(squares)
    norm = math.sqrt(float(squares))
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for g in local:
            g.detach().mul_(coef)
    return norm
