"""FSDP's sharded tensors in a checkpoint: each rank writes the part of every tensor it holds into one
file of its own (`shards/tensors-<rank>.pt`, layout.shard_file), with where each part sits in its
whole tensor. Loading copies into each tensor, however it is spread now, the pieces of the saved
parts that overlap what this rank holds: a run saved on 4 ranks loads on 2 or 3, into DDP's whole
tensors, or whole in one process (`read_model`).

One `torch.save` per rank rather than `torch.distributed.checkpoint` (how earlier releases stored
shards; checkpoint.state still loads those): DCP plans every save (a write item per tensor, then
collectives to agree on a global plan) and writes each tensor as a `torch.save` of its own, which
made a synchronous sharded save cost 1.5-2.8x a bare `torch.save` of the same bytes. Here a rank's
parts are known from its own DTensors, without a collective, and written as one file.

Loading maps every rank's file (torch.load with mmap): only the pages of the pieces copied are
read, but each loading rank opens each saved rank's file.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from torchslurm.errors import CheckpointError
from torchslurm.train.checkpoint.layout import SHARD_FILES, SHARDS
from torchslurm.train.checkpoint.reading import load_plain

_PARTS = ("tensors", "offsets", "shapes", "dtypes")
"""A shard file's entries, each keyed by tensor: this rank's part, its offset in the whole tensor, the
whole tensor's shape and dtype (the last two of every tensor, written or not)."""


def parts(tensors: Mapping[str, Any], rank: int) -> dict[str, dict[str, Any]]:
    """What rank `rank` writes of `tensors` (live tensors or staged copies; DTensors where sharded).

    A part that other ranks hold as well is written once: a plain tensor (replicated, such as the
    optimizer's step count) by rank 0, a DTensor replicated over a mesh dimension by the first rank
    along it. Empty parts (uneven shards) are left out."""
    found: dict[str, dict[str, Any]] = {name: {} for name in _PARTS}
    with torch.no_grad():  # to_local() outside autograd: 1 µs a tensor rather than 70
        for key, value in tensors.items():
            found["shapes"][key], found["dtypes"][key] = tuple(value.shape), value.dtype
            if isinstance(value, DTensor):
                offset, writes = _where(tuple(value.shape), value.device_mesh, tuple(value.placements))
                part = value.to_local()
            else:
                offset, writes, part = (0,) * value.dim(), rank == 0, value
            if writes and part.numel() > 0:
                found["tensors"][key], found["offsets"][key] = _compact(part), offset
    return found


@functools.lru_cache(maxsize=4096)
def _where(shape: tuple[int, ...], mesh: DeviceMesh, placements: tuple[Placement, ...]) -> tuple[tuple[int, ...], bool]:
    """This rank's part of a DTensor of `shape` spread as `placements` over `mesh`: its offset in the
    whole tensor, and whether this rank writes it (the first along every mesh dimension it is not
    sharded over). Cached: torch takes 0.2 ms for it, and every save asks again for the same few."""
    _, offset = compute_local_shape_and_global_offset(shape, mesh, placements)
    coordinate = mesh.get_coordinate() or ()
    writes = all(at == 0 for at, placement in zip(coordinate, placements, strict=False) if not placement.is_shard())
    return tuple(offset), writes


def _compact(part: torch.Tensor) -> torch.Tensor:
    """`part` on the CPU (so that it loads anywhere, memory-mapped) and alone in its storage:
    torch.save writes a tensor's whole storage, and FSDP's uneven shards are views into a padded one."""
    if part.device.type != "cpu":
        return part.cpu()
    if part.is_contiguous() and part.untyped_storage().nbytes() == part.numel() * part.element_size():
        return part
    return part.clone(memory_format=torch.contiguous_format)


def written(folder: Path) -> list[Path]:
    """The shard files of the checkpoint `folder`, one per rank that saved it; none in a checkpoint of
    replicated tensors or of DCP's shards."""
    return sorted((folder / SHARDS).glob(SHARD_FILES))


def read(folder: Path) -> list[dict[str, dict[str, Any]]]:
    """Every saved rank's file of `folder`, memory-mapped: tensors are read as they are copied."""
    files = []
    for path in written(folder):
        content = load_plain(path, mmap=True)
        if not all(isinstance(content.get(name), dict) for name in _PARTS):
            raise CheckpointError(f"checkpoint {path} holds {sorted(content)}, expected the entries {list(_PARTS)}.",
                                  "it was not written by torchslurm; delete this directory.")
        files.append(content)
    return files


def whole_shapes(saved: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, tuple[int, ...]]:
    """The whole shape of every tensor the saved files hold."""
    return {key: tuple(shape) for content in saved for key, shape in content["shapes"].items()}


def empty_wholes(saved: Sequence[Mapping[str, Mapping[str, Any]]], prefix: str) -> dict[str, torch.Tensor]:
    """Uninitialised whole CPU tensors for the saved tensors whose keys start with `prefix`, to `fill`."""
    dtypes = {key: dtype for content in saved for key, dtype in content["dtypes"].items()}
    return {key: torch.empty(shape, dtype=dtypes[key]) for key, shape in whole_shapes(saved).items()
            if key.startswith(prefix)}


def fill(folder: Path, saved: Sequence[Mapping[str, Mapping[str, Any]]], targets: Mapping[str, Any]) -> None:
    """Copy into each of `targets` (tensors, or DTensors spread as now; their keys all saved, in their
    whole shapes) the pieces of the saved parts that overlap what this rank holds of it. Every
    element held must be found: a missing part is the checkpoint's error."""
    with torch.no_grad():
        for key, target in targets.items():
            if isinstance(target, DTensor):
                offset = _where(tuple(target.shape), target.device_mesh, tuple(target.placements))[0]
                local = target.to_local()
            else:
                offset, local = (0,) * target.dim(), target
            found = 0
            for content in saved:
                part = content["tensors"].get(key)
                if part is not None:
                    found += _copy_overlap(local, offset, part, tuple(content["offsets"][key]))
            if found != local.numel():
                raise CheckpointError(
                    f"checkpoint {folder}: the saved parts of {key} hold {found} of the {local.numel()} elements "
                    "this rank needs.",
                    f"a file of {folder / SHARDS} is missing or was not written by torchslurm; delete this directory: "
                    "resume=auto then uses the previous checkpoint.")


def _copy_overlap(local: torch.Tensor, offset: Sequence[int], part: torch.Tensor, part_offset: Sequence[int]) -> int:
    """Copy the piece of `part` (at `part_offset` in the whole tensor) that overlaps `local` (at
    `offset`) into `local`; how many elements that is."""
    if len(part_offset) != local.dim() or part.dim() != local.dim():
        return 0
    mine, theirs = [], []
    for at, size, part_at, part_size in zip(offset, local.shape, part_offset, part.shape, strict=True):
        start, stop = max(at, part_at), min(at + size, part_at + part_size)
        if start >= stop:
            return 0
        mine.append(slice(start - at, stop - at))
        theirs.append(slice(start - part_at, stop - part_at))
    piece = local[tuple(mine)]
    piece.copy_(part[tuple(theirs)])
    return piece.numel()
