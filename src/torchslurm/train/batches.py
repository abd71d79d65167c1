"""What a batch may be, and how it reaches the device: whatever the DataLoader yields (its collate
function's output) — a tensor, a tuple, list or named tuple, a dict (nested as deep as you like), a
dataclass, or any other object holding tensors — moved to the rank's device as a whole, keeping its
shape and types. Strings, numbers and other non-tensors ride along unchanged.

How a moved batch becomes a loss is train.step's business.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["describe", "first_tensor", "samples", "to_device"]


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """`batch` with every tensor in it on `device`. An object with a `.to(device)` of its own (Hugging
    Face's BatchEncoding) moves itself; a mapping, sequence or dataclass is rebuilt as its own type
    (a plain dict or list when its type cannot be rebuilt from its items); any other object with
    tensors among its attributes is copied (shallow) with those attributes moved."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, str | bytes | int | float | bool) or batch is None:
        return batch
    move = _mover(device, non_blocking)
    if callable(getattr(batch, "to", None)) and not isinstance(batch, torch.nn.Module):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return _rebuilt(batch, {key: move(value) for key, value in batch.items()})
    if isinstance(batch, tuple):
        items = [move(value) for value in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else _rebuilt(batch, tuple(items))
    if isinstance(batch, list):
        return _rebuilt(batch, [move(value) for value in batch])
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: move(getattr(batch, f.name))  # type: ignore[misc]
                                             for f in dataclasses.fields(batch) if f.init})
    attributes = getattr(batch, "__dict__", None)
    if attributes and any(first_tensor(value) is not None for value in attributes.values()):
        moved = copy.copy(batch)
        for name, value in attributes.items():
            setattr(moved, name, move(value))
        return moved
    return batch


def _mover(device: torch.device, non_blocking: bool) -> Any:
    return lambda value: to_device(value, device, non_blocking)


def _rebuilt(original: Any, items: Any) -> Any:
    """`items` as the type of `original` when that type builds from them (dict and list subclasses
    usually do), else as they are."""
    if type(original) in (dict, list, tuple):
        return items
    try:
        return type(original)(items)
    except Exception:  # a type with another constructor (defaultdict, a class of its own): plain items
        return items


def first_tensor(batch: Any) -> torch.Tensor | None:
    """The first tensor in `batch`, depth first (a mapping in its order); None when it holds none."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, str | bytes):
        return None
    if isinstance(batch, Mapping):
        values: Any = batch.values()
    elif isinstance(batch, tuple | list):
        values = batch
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        values = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    else:
        values = list(getattr(batch, "__dict__", {}).values())
    return next((found for value in values if (found := first_tensor(value)) is not None), None)


def samples(batch: Any) -> int:
    """How many samples `batch` holds: the length of its first tensor (1 for a batch without one, or
    whose first tensor is a single number)."""
    tensor = first_tensor(batch)
    return int(tensor.shape[0]) if tensor is not None and tensor.dim() > 0 else 1


def describe(batch: Any) -> str:
    """A batch's structure for a message: `(Tensor[32, 10], Tensor[32], Tensor[32])`,
    `dict(input_ids=Tensor[8, 64], text=list)`."""
    if isinstance(batch, torch.Tensor):
        return f"Tensor[{', '.join(str(d) for d in batch.shape)}]"
    if isinstance(batch, Mapping):
        inner = ", ".join(f"{key}={describe(value)}" for key, value in list(batch.items())[:8])
        return f"{type(batch).__name__}({inner}{', …' if len(batch) > 8 else ''})"
    if isinstance(batch, tuple | list):
        parts = [describe(value) for value in batch]
        if len(parts) > 2 and len(set(parts)) == 1:  # 32 strings: [str × 32]
            inner = f"{parts[0]} × {len(parts)}"
        else:
            inner = ", ".join(parts[:8]) + (", …" if len(parts) > 8 else "")
        return f"({inner})" if isinstance(batch, tuple) else f"[{inner}]"
    return type(batch).__name__
