"""Fakes shared by the train tests. Import them as `from tests.unit.train.conftest import Recorder`."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence


class Recorder:
    """A fake Slurm command runner: records argv, answers with a fixed result."""

    def __init__(self, returncode: int = 0, stdout: str = "", stderr: str = "") -> None:
        self.calls: list[list[str]] = []
        self.result = (returncode, stdout, stderr)

    def __call__(self, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        return subprocess.CompletedProcess(list(argv), *self.result)
