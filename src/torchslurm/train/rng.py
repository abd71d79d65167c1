"""Every random stream of a process, seeded, captured and put back: python's, numpy's, torch's on the
CPU and on every GPU. A checkpoint carries each rank's states, so a resumed run draws the same dropout
masks and augmentations as an uninterrupted one."""

from __future__ import annotations

import os
import random
from typing import Any, cast

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices) — call before building the model."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_repeatable(deterministic: bool) -> None:
    """deterministic=true: torch's deterministic algorithms (a warning where an op has none), so that two
    runs of the same seed and world size are bitwise the same, compiled ones too (Inductor's kernels that
    scatter-add with atomics, such as an embedding's backward, otherwise add in a varying order on a GPU
    and on a CPU with more than one thread). cuBLAS then needs a fixed workspace: set unless
    CUBLAS_WORKSPACE_CONFIG says otherwise."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)


def rng_state() -> dict[str, Any]:
    """This process's RNG states as tensors and plain types (loadable with weights_only=True)."""
    version, internal, gauss = random.getstate()
    key, keys, pos, has_gauss, cached = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    return {
        "python": [version, list(internal), gauss],
        "numpy": {"key": key, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back what rng_state() captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["key"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
