"""The first release's writer (format 1: one state.pt written by rank 0), kept to make old-format
checkpoints in tests; the Trainer writes format 2 (checkpoint.writer). Its checkpoints still load."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from torchslurm.train.checkpoint import integrity
from torchslurm.train.checkpoint.layout import MARKER, STATE_FILE, Pruner, fsync, publish, remove_leftovers, step_dir


def write_format1(root: Path, step: int, state: Mapping[str, Any], keep_last: int = 2,
                  pruner: Pruner | None = None) -> Path:
    """`state` as `<root>/step-N` in format 1, atomically, then all but the newest `keep_last` deleted."""
    root = Path(root)
    final, staging = step_dir(root, step), root / f".staging-{step:09d}-{os.getpid()}"
    remove_leftovers(root)
    staging.mkdir(parents=True)
    torch.save(dict(state), staging / STATE_FILE)
    fsync(staging / STATE_FILE)
    marker = {"step": step, "sha256": integrity.of_file(staging / STATE_FILE, hashlib.sha256())}
    (staging / MARKER).write_text(json.dumps(marker) + "\n")
    publish(staging, final, keep_last, pruner or Pruner())
    return final
