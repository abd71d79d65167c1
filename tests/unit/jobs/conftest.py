"""What the jobs tests share: Slurm commands' recorded output, and a runner that answers with it."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

OUT = Path(__file__).parents[2] / "fixtures" / "slurm_output"


def fixture(name: str) -> str:
    return (OUT / name).read_text()


class FakeRun:
    """Answers each command with a recorded output; remembers the argv it got. `sinfo` answers with
    the sandbox's 4 nodes unless a test says otherwise (submit asks it before sbatch)."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers: dict[str, tuple[int, str, str]] = {"sinfo": (0, fixture("sinfo_nodes.txt"), ""), **answers}
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        code, out, err = self.answers[argv[0]]
        return subprocess.CompletedProcess(list(argv), code, out, err)
