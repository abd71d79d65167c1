"""A text corpus every machine has offline: the Python standard library's own source files,
read as bytes (a byte-level vocabulary of 256), cut into fixed-length windows for next-token
prediction.

The files are those directly in `sysconfig.get_paths()["stdlib"]`, sorted by name, read until
`max_bytes`: the same bytes on every rank and every run of the same Python version.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from torchslurm.errors import ConfigError

VOCAB = 256
"""Byte-level: every byte value is a token."""


def stdlib_corpus(max_bytes: int = 1 << 20, root: Path | None = None) -> bytes:
    """Up to `max_bytes` of the standard library's top-level *.py files, in name order."""
    folder = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(folder.glob("*.py")) if folder.is_dir() else []
    if not files:
        raise ConfigError(f"dataset=text reads the Python standard library's *.py files, but {folder} has none.",
                          "run with a Python whose standard library is installed as source files "
                          "(python -c 'import sysconfig; print(sysconfig.get_paths()[\"stdlib\"])').")
    chunks, size = [], 0
    for path in files:
        data = path.read_bytes()
        chunks.append(data[: max_bytes - size])
        size += len(chunks[-1])
        if size >= max_bytes:
            break
    return b"".join(chunks)


def windows(corpus: bytes, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping (input, next-token target) pairs of `block_size` tokens each."""
    if block_size < 2 or len(corpus) < 2 * (block_size + 1):
        raise ConfigError(f"block_size={block_size} on a corpus of {len(corpus)} bytes: expected at least 2 "
                          "tokens per window and 2 windows.", "use block_size=64.")
    tokens = torch.from_numpy(np.frombuffer(corpus, dtype=np.uint8).astype(np.int64))
    n = (len(tokens) - 1) // block_size
    x = tokens[: n * block_size].view(n, block_size)
    y = tokens[1 : n * block_size + 1].view(n, block_size)
    return x, y


def stdlib_text(block_size: int = 64, max_bytes: int = 1 << 18, val_fraction: float = 0.1,
                seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """(train, val) windows of the standard-library corpus, split by a permutation of `seed`."""
    x, y = windows(stdlib_corpus(max_bytes), block_size)
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(x)))
    n_val = max(1, round(len(x) * val_fraction))
    val, train = order[:n_val], order[n_val:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])
