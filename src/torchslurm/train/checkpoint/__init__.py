"""Checkpoints that readers see whole or not at all, and the Trainer's resume from them.

    Checkpointer, TrainProgress   save a run's progress, restore it (checkpointer)
    load, load_latest, read_model read a checkpoint, never unpickling code (reading, state)
    load_model, export            a run's weights into a plain model, or one state_dict file (weights)
    complete, step_dir, ...       the folder protocol and its file names, torch-free (layout)

Private parts: `layout` (folders, names, publish, prune), `integrity` (checksums), `hashed` (files
checksummed while written), `reading` (safe loading), `state` (model and optimizer state split and
loaded), `shards` (FSDP's sharded tensors, a file per rank), `writer` (snapshots, the background
writer), `durability` (fsyncs on a thread, a failed save's message), `checkpointer`, `weights`.
Importing this package does not import torch; the names that need it load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from torchslurm.train.checkpoint.layout import (
    FORMAT,
    MARKER,
    SHARDS,
    STATE_FILE,
    TENSORS_FILE,
    complete,
    folder_of,
    rank_file,
    step_dir,
)

if TYPE_CHECKING:
    from torchslurm.train.checkpoint.checkpointer import Checkpointer, TrainProgress
    from torchslurm.train.checkpoint.reading import load, load_latest, load_plain
    from torchslurm.train.checkpoint.state import read_model
    from torchslurm.train.checkpoint.weights import export, load_model

__all__ = ["FORMAT", "MARKER", "SHARDS", "STATE_FILE", "TENSORS_FILE", "Checkpointer", "TrainProgress", "complete",
           "export", "folder_of", "load", "load_latest", "load_model", "load_plain", "rank_file", "read_model",
           "step_dir"]

_LAZY = {"Checkpointer": "checkpointer", "TrainProgress": "checkpointer", "load": "reading",
         "load_latest": "reading", "load_plain": "reading", "read_model": "state", "load_model": "weights",
         "export": "weights"}


def __getattr__(name: str) -> Any:
    """The torch-bound names, imported on first use (PEP 562)."""
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
