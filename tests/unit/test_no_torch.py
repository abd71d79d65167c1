"""Writing, linting and submitting jobs must work on a login node where torch is not installed."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

WithoutTorch = Callable[..., subprocess.CompletedProcess[str]]

SRC = Path(__file__).parents[2] / "src"
# Modules that train, and so import torch at the top; every other module must import without it.
TORCH_MODULES = {"torchslurm.runtime.distributed", "torchslurm.train.trainer", "torchslurm.train.rng",
                 "torchslurm.train.report",
                 "torchslurm.train.metrics", "torchslurm.train.data", "torchslurm.train.models",
                 "torchslurm.train.watchdog", "torchslurm.train.fsdp", "torchslurm.train.steptime",
                 "torchslurm.train.strategy", "torchslurm.train.tasks", "torchslurm.train.text",
                 "torchslurm.train.checkpoint.hashed", "torchslurm.train.checkpoint.reading",
                 "torchslurm.train.checkpoint.state", "torchslurm.train.checkpoint.shards",
                 "torchslurm.train.checkpoint.writer", "torchslurm.train.checkpoint.copying",
                 "torchslurm.train.checkpoint.checkpointer", "torchslurm.train.checkpoint.weights",
                 "torchslurm.train.batches", "torchslurm.train.step", "torchslurm.train.validation",
                 "torchslurm.doctor.bench"}
TORCH_FREE_MODULES = sorted(
    name for name in (".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
                      for path in (SRC / "torchslurm").rglob("*.py"))
    if name not in TORCH_MODULES and not name.endswith("__main__"))
TORCH_FREE_COMMANDS = [["--help"], ["run", "--help"], ["run", "--dry-run", "train.py"],
                       ["sweep", "--dry-run", "--grid", "lr=0.1,0.01", "train.py"], ["results", "--help"]]


def test_the_block_really_blocks_torch(without_torch: WithoutTorch) -> None:
    result = without_torch("-c", "import torch")
    assert result.returncode != 0 and "blocked by the test" in result.stderr


@pytest.mark.parametrize("module", TORCH_FREE_MODULES)
def test_module_imports_without_torch(module: str, without_torch: WithoutTorch) -> None:
    result = without_torch("-c", f"import {module}")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("argv", TORCH_FREE_COMMANDS, ids=" ".join)
def test_command_works_without_torch(argv: list[str], without_torch: WithoutTorch, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('training')\n")  # run checks that the script is there
    result = without_torch(*argv, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "usage:" in result.stdout or "local" in result.stdout or "points to submit" in result.stdout
