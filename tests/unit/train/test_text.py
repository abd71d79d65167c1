"""The built-in text data: the standard library's source as bytes, cut into next-token windows."""

from __future__ import annotations

import pytest
import torch

from torchslurm.errors import ConfigError
from torchslurm.train import text


def test_text_windows_are_next_tokens_and_deterministic() -> None:
    x, y = text.windows(b"abcdefghij", 3)
    assert x.tolist() == [[97, 98, 99], [100, 101, 102], [103, 104, 105]]
    assert y[0].tolist() == [98, 99, 100]
    a, b = text.stdlib_text(block_size=8, max_bytes=4096), text.stdlib_text(block_size=8, max_bytes=4096)
    assert torch.equal(a[0].tensors[0], b[0].tensors[0])
    with pytest.raises(ConfigError, match="block_size=1"):
        text.windows(b"abc", 1)
