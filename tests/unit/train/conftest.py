"""Fakes shared by the train tests. Import them as `from tests.unit.train.conftest import Recorder`."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence

import pytest
import torch.distributed as dist


class Recorder:
    """A fake Slurm command runner: records argv, answers with a fixed result."""

    def __init__(self, returncode: int = 0, stdout: str = "", stderr: str = "") -> None:
        self.calls: list[list[str]] = []
        self.result = (returncode, stdout, stderr)

    def __call__(self, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        return subprocess.CompletedProcess(list(argv), *self.result)


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A one-rank Gloo process group in this process, as a script that calls init_process_group itself."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
