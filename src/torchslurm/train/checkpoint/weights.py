"""A run's weights back out, in one process and without a process group: into a plain model for
inference or fine-tuning (`load_model`), or into one plain state_dict file (`export`, the command
`torchslurm export RUN_DIR out.pt`).

Either layout loads: `tensors.pt` (DDP or one process; its `model.` entries, not the optimizer's)
and FSDP's `shards/` (every rank's parts put together in this process, checkpoint.state.read_model;
or, as earlier releases wrote them, through DCP's no-process-group path),
as well as the single-file checkpoints of the first release. The checkpoint is the newest whose
checksums verify (a corrupt newer one is skipped with a warning), or the step-N folder named.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchslurm.errors import CheckpointError
from torchslurm.train.checkpoint.layout import CHECKPOINTS, FORMAT, MARKER, STATE_FILE, folder_of
from torchslurm.train.checkpoint.reading import load, load_latest
from torchslurm.train.checkpoint.state import read_model
from torchslurm.train.strategy import unwrapped

__all__ = ["Loaded", "export", "load_model", "newest", "read_weights"]


@dataclass(frozen=True)
class Loaded:
    """What `load_model` loaded."""

    folder: Path
    """The step-N folder the weights came from."""
    step: int
    """Its optimizer step (global_step)."""
    missing: tuple[str, ...] = ()
    """strict=False: the model's entries the checkpoint has no match for (left as they were)."""
    skipped: tuple[str, ...] = ()
    """strict=False: the checkpoint's entries the model has no place of that shape for."""


def newest(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """(the step-N folder, its state.pt) that `path` names: a step-N folder (or its state.pt) as it is,
    else the newest verified checkpoint of a run_dir or of its checkpoints/ folder."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist.", "pass a run_dir, its checkpoints/ folder or a step-N folder.")
    if path.name == STATE_FILE or (path / STATE_FILE).exists() or (path / MARKER).exists():
        return folder_of(path), load(path)
    root = path / CHECKPOINTS if (path / CHECKPOINTS).is_dir() else path
    found = load_latest(root)
    if found is None:
        raise CheckpointError(f"{path} holds no complete checkpoint (no step-N folder with a {MARKER} marker in "
                              f"{root}).",
                              "pass the run_dir of a run that saved one (the Trainer's config.run_dir), or a step-N "
                              "folder.")
    return folder_of(found[0]), found[1]


def read_weights(path: str | os.PathLike[str]) -> tuple[Path, int, dict[str, torch.Tensor]]:
    """(folder, step, the model's state_dict as CPU tensors) of the checkpoint `path` names (`newest`)."""
    folder, state = newest(path)
    weights = read_model(folder) if state.get("format", 1) >= FORMAT else dict(state["model"])
    return folder, int(state.get("global_step", 0)), weights


def load_model(model: nn.Module, path: str | os.PathLike[str], strict: bool = True) -> Loaded:
    """Load the model weights of the checkpoint `path` names (a run_dir: its newest verified one) into
    `model`, a plain module (built as for training; a DDP or torch.compile wrapper is looked through),
    in this one process. `strict=False` loads every entry whose name and shape match and reports the
    others (fine-tuning with a new head); strict, any difference is an error naming it."""
    folder, step, weights = read_weights(path)
    target = unwrapped(model)
    own = target.state_dict()
    missing = sorted(own.keys() - weights.keys())
    unexpected = sorted(weights.keys() - own.keys())
    reshaped = sorted(k for k in own.keys() & weights.keys() if own[k].shape != weights[k].shape)
    if strict and (missing or unexpected or reshaped):
        found = "; ".join(f"{what}: {_few(keys)}" for what, keys in (
            ("missing", missing), ("not in the model", unexpected),
            ("other shape", [f"{k} (saved {tuple(weights[k].shape)}, model {tuple(own[k].shape)})" for k in reshaped]),
        ) if keys)
        raise CheckpointError(f"checkpoint {folder} holds the weights of another model ({found}).",
                              f"build {type(target).__name__} as it was trained (checkpoint.load(folder)['config'] has "
                              "the run's settings), or pass strict=False to load only what matches (a new head).")
    usable = {k: v for k, v in weights.items() if k in own and own[k].shape == v.shape}
    target.load_state_dict(usable, strict=False)
    return Loaded(folder, step, tuple(sorted(own.keys() - usable.keys())),
                  tuple(sorted(weights.keys() - usable.keys())))


def export(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> tuple[Path, int, dict[str, torch.Tensor]]:
    """Write the model weights of the checkpoint `path` names as one plain state_dict file `out`
    (`torch.load(out, weights_only=True)` reads it; `model.load_state_dict` takes it), atomically.
    Returns what `read_weights` read."""
    folder, step, weights = read_weights(path)
    out = Path(out)
    if out.is_dir():
        raise CheckpointError(f"{out} is a directory; expected the path of the file to write.",
                              f"name a file, e.g. {out / 'model.pt'}.")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        torch.save({k: v.contiguous() for k, v in weights.items()}, partial)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return folder, step, weights


def _few(keys: list[str]) -> str:
    return ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")

