"""Model and optimizer state as a checkpoint holds it: split into tensors (live ones, DTensor shards
under FSDP) and plain values, keyed `model.<name>` and `optim.<flattened name>`; loaded back into a
model spread however it is spread now (a run saved on 4 ranks loads on 2 or 3: each rank copies the
part of each tensor it now holds from the saved parts (checkpoint.shards), and a replicated
checkpoint loads into shards and back). Shards that earlier releases wrote through DCP load through
DCP."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.tensor import DTensor, distribute_tensor

from torchslurm.errors import CheckpointError
from torchslurm.train.checkpoint import shards
from torchslurm.train.checkpoint.layout import SHARDS, TENSORS_FILE
from torchslurm.train.checkpoint.reading import SafeReader

_WRAPPERS: tuple[type, ...] = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
_WRAPPER_PARTS = frozenset({"_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_flat_param"})
"""Names that torch.compile, activation checkpointing and FSDP1 put into parameter names and
get_state_dict takes out."""
_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


def split_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensors for DCP, everything else) of model and optimizer, keyed `model.<name>` and
    `optim.<flattened name>`. The tensors are the live ones (DTensor shards under FSDP)."""
    model_sd, optim_sd = _plain_state_dict(model, optimizer) or get_state_dict(model, optimizer, options=_FLAT)
    tensors: dict[str, Any] = {}
    plain: dict[str, Any] = {}
    for prefix, part in (("model.", model_sd), ("optim.", optim_sd)):
        for key, value in part.items():
            (tensors if isinstance(value, torch.Tensor) else plain)[prefix + key] = value
    return tensors, plain


def _plain_state_dict(model: nn.Module,
                      optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """get_state_dict(model, optimizer, flattened) of a plain, DDP-wrapped or FSDP2-sharded module (no
    other wrapper, no parameter under two names), built directly: DCP's version costs 5 ms a save for a
    100-tensor model, mostly in mapping names it has to expect wrappers in, and 70 ms for a 400-tensor
    FSDP2 one on a loaded machine. DDP's state is its module's, under the module's names (as
    get_state_dict gives it); FSDP2's `fully_shard` renames nothing: its state_dict holds the DTensor
    parameters under their own names, and the optimizer holds them. None for any other module, and
    for an optimizer without state yet (DCP creates it, and loading needs those targets)."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):  # get_state_dict drops its `module.`
        model = cast(nn.Module, model.module)
    named = list(model.named_parameters(remove_duplicate=False))
    names = {id(p): name for name, p in named}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    model_sd = model.state_dict()
    if (not optimizer.state or isinstance(model, _WRAPPERS) or len(names) != len(named)
            or any(part in _WRAPPER_PARTS for key in model_sd for part in key.split("."))
            or any(id(p) not in names for p in params)):
        return None
    optim: dict[str, Any] = {}
    for p in params:
        for key, value in optimizer.state.get(p, {}).items():
            optim[f"state.{names[id(p)]}.{key}"] = value
    for group in optimizer.param_groups:
        settings = {key: value for key, value in group.items() if key != "params"}
        for p in group["params"]:
            for key, value in settings.items():
                optim[f"param_groups.{names[id(p)]}.{key}"] = value
    return model_sd, optim


def local_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    """The bytes of `tensors` this rank holds (a DTensor's local shard)."""
    with torch.no_grad():  # to_local() outside autograd: 1 µs a tensor rather than 70
        local = [v.to_local() if isinstance(v, DTensor) else v for v in tensors.values()]
    return sum(t.numel() * t.element_size() for t in local)


def stage(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies in CPU memory (DTensors stay DTensors), so training may change the originals."""
    return {k: v.detach().to("cpu") if v.device.type != "cpu" else v.detach().clone() for k, v in tensors.items()}


def load_into(folder: Path, state: Mapping[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Model and optimizer from `folder`'s tensors (and `state`, its state.pt), spread however they
    are spread now: shards resharded, replicated tensors sharded. Every rank calls it."""
    tensors, _ = split_state(model, optimizer)  # targets shaped as now (optimizer state initialised)
    if (folder / TENSORS_FILE).is_file():
        saved = _read_replicated(folder)
        _check_same_tensors(folder, {key: tuple(value.shape) for key, value in saved.items()}, tensors)
        tensors = {key: _spread_like(saved[key], target) for key, target in tensors.items()}
    elif shards.written(folder):
        parts = shards.read(folder)
        _check_same_tensors(folder, shards.whole_shapes(parts), tensors)
        shards.fill(folder, parts, tensors)
    else:  # DCP's shards, as earlier releases wrote them
        _check_same_tensors(folder, _shard_shapes(folder), tensors)
        read_shards(folder, tensors, alone=not distributed())
    values = {**tensors, **state["optim_plain"]}
    model_sd, optim_sd = _part(values, "model."), _part(values, "optim.")
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=_FLAT)


def _part(values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The entries of `values` under `prefix` ("model." or "optim."), keyed without it."""
    return {k.removeprefix(prefix): v for k, v in values.items() if k.startswith(prefix)}


def _read_replicated(folder: Path) -> dict[str, torch.Tensor]:
    """tensors.pt, mapped rather than read: every rank of a node shares its pages."""
    loaded = torch.load(folder / TENSORS_FILE, map_location="cpu", weights_only=True, mmap=True)
    return cast(dict[str, torch.Tensor], loaded)


def _spread_like(whole: torch.Tensor, target: Any) -> Any:
    """A whole tensor as `target` is held now: the same DTensor shard of it (cut locally, no
    collective), or itself."""
    if not isinstance(target, DTensor):
        return whole
    return distribute_tensor(whole.to(target.device), target.device_mesh, target.placements, src_data_rank=None)


def _shard_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """The whole shape of every tensor in a sharded checkpoint, from DCP's metadata."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = SafeReader(folder / SHARDS).read_metadata()
    return {key: tuple(meta.size) for key, meta in metadata.state_dict_metadata.items()
            if isinstance(meta, TensorStorageMetadata)}


def _check_same_tensors(folder: Path, saved: Mapping[str, tuple[int, ...]], wanted: Mapping[str, Any]) -> None:
    """The checkpoint holds every tensor the model and optimizer now have, in their (whole) shapes."""
    missing = sorted(wanted.keys() - saved.keys())
    unexpected = sorted(saved.keys() - wanted.keys())
    reshaped = sorted(k for k in wanted.keys() & saved.keys() if tuple(wanted[k].shape) != saved[k])
    if missing or unexpected or reshaped:
        found = "; ".join(f"{what}: {', '.join(keys[:4])}{' …' if len(keys) > 4 else ''}" for what, keys in
                          (("missing", missing), ("not in the model", unexpected), ("other shape", reshaped)) if keys)
        raise CheckpointError(f"checkpoint {folder} was saved from another model or optimizer ({found}).",
                              "resume with the model and optimizer it was trained with, or start over "
                              "with resume=never or a new run_dir.")


def load_single_file(state: Mapping[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A format-1 checkpoint (the whole model and optimizer in state.pt, saved by rank 0) into a
    plain or FSDP-sharded model: its optimizer state is keyed by parameter position, named here."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    saved = state["optimizer"]
    optim_sd: dict[str, Any] = {
        "state": {order[int(i)]: v for i, v in saved["state"].items()},
        "param_groups": [{**g, "params": [order[int(i)] for i in g["params"]]} for g in saved["param_groups"]],
    }
    set_state_dict(model, optimizer, model_state_dict=dict(state["model"]), optim_state_dict=optim_sd,
                   options=StateDictOptions(full_state_dict=True))


def read_model(folder: Path) -> dict[str, torch.Tensor]:
    """The whole model state of a checkpoint as CPU tensors, read in this one process (no process
    group): for inspecting or exporting a checkpoint, e.g. `torch.save(read_model(step), "model.pt")`."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    folder = Path(folder)
    if (folder / TENSORS_FILE).is_file():
        return _part(_read_replicated(folder), "model.")
    if shards.written(folder):
        saved = shards.read(folder)
        model = shards.empty_wholes(saved, "model.")
        shards.fill(folder, saved, model)
        return _part(model, "model.")
    metadata = SafeReader(folder / SHARDS).read_metadata()
    model = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in metadata.state_dict_metadata.items()
             if k.startswith("model.") and isinstance(m, TensorStorageMetadata)}
    read_shards(folder, model, alone=True)
    return _part(model, "model.")


def read_shards(folder: Path, tensors: dict[str, Any], alone: bool) -> None:
    """`tensors` filled from `folder`'s DCP shards/ through the SafeReader (every rank of the group calls
    it, unless `alone`). The metadata is checked before DCP starts, so a refused checkpoint fails
    with the reader's own error on every rank rather than inside DCP's collectives."""
    from torch.distributed.checkpoint.api import CheckpointException

    reader = SafeReader(folder / SHARDS)
    reader.read_metadata()
    try:
        with quiet_alone():
            dcp_load(tensors, storage_reader=reader, no_dist=alone)
    except CheckpointException as exc:  # DCP gathers every rank's failure; ours says what is wrong
        ours = [error for error, _ in exc.failures.values() if isinstance(error, CheckpointError)]
        if ours:
            raise ours[0] from exc
        raise


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextmanager
def quiet_alone() -> Iterator[None]:
    """DCP warns that it assumes one process when told to work alone (no_dist): here that is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
