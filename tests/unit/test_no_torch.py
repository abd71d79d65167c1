"""Writing, linting and submitting jobs must work on a login node where torch is not installed."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

WithoutTorch = Callable[..., subprocess.CompletedProcess[str]]

# Modules and commands that must work without torch.
TORCH_FREE_MODULES = ["torchslurm", "torchslurm.errors", "torchslurm.hostlist", "torchslurm.distenv",
                      "torchslurm.launch", "torchslurm.cli",
                      "torchslurm.jobspec", "torchslurm.sbatch", "torchslurm.lint", "torchslurm.lint_launch",
                      "torchslurm.lint_options", "torchslurm.lint_parse", "torchslurm.slurm",
                      "torchslurm.job", "torchslurm.configfile", "torchslurm.config", "torchslurm.findings",
                      "torchslurm.requeue", "torchslurm.doctor", "torchslurm.facts", "torchslurm.netcheck",
                      "torchslurm.probe"]
TORCH_FREE_COMMANDS = [["--help"], ["run", "--help"], ["run", "--dry-run", "train.py"]]


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
    assert "usage:" in result.stdout or "local" in result.stdout
