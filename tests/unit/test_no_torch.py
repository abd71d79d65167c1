"""Writing, linting and submitting jobs must work on a login node where torch is not installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Modules and commands that must work without torch.
TORCH_FREE_MODULES = ["torchslurm", "torchslurm.errors", "torchslurm.hostlist", "torchslurm.distenv",
                      "torchslurm.launch", "torchslurm.cli",
                      "torchslurm.jobspec", "torchslurm.sbatch", "torchslurm.lint", "torchslurm.slurm",
                      "torchslurm.job"]
TORCH_FREE_COMMANDS = [["--help"], ["run", "--help"], ["run", "--dry-run", "train.py"]]

BLOCK_TORCH = textwrap.dedent("""
    import sys

    class BlockTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, BlockTorch())
""")


def run_without_torch(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})


def test_the_block_really_blocks_torch() -> None:
    result = run_without_torch("import torch")
    assert result.returncode != 0 and "blocked by the test" in result.stderr


@pytest.mark.parametrize("module", TORCH_FREE_MODULES)
def test_module_imports_without_torch(module: str) -> None:
    result = run_without_torch(f"import {module}; import sys; assert 'torch' not in sys.modules")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("argv", TORCH_FREE_COMMANDS, ids=" ".join)
def test_command_works_without_torch(argv: list[str]) -> None:
    result = run_without_torch(f"""
        import sys
        from torchslurm.cli import main
        try:
            code = main({argv!r})
        except SystemExit as exc:
            code = exc.code
        assert 'torch' not in sys.modules, 'torch was imported'
        sys.exit(code)
    """)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "usage:" in result.stdout or "local" in result.stdout
