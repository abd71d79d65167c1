"""Helpers shared by the multi-process tests (and the cluster tests): one definition each.

Import them as `from tests.multiproc.conftest import clean_environ` (pytest loads conftest files
before the test modules, under that name with --import-mode=importlib).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_", "TORCHSLURM_", "NCCL_", "GLOO_")
"""Variables of a launcher (Slurm, Open MPI, PMI, torchrun), of torchslurm's own settings and of the
NCCL/Gloo interface choice: any of them would change what the ranks detect or where they connect."""
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "MASTER_ADDR", "MASTER_PORT")
"""torchrun's placement variables, which make a process a rank of some other run."""
NETWORK = ("net1.weight", "net1.bias", "net2.weight", "net2.bias")
"""The parameters of scripts/preempt_train.py's network (and of the cluster tests' job)."""


def clean_environ(**extra: str) -> dict[str, str]:
    """This machine's environment without launcher variables that would change the mode, plus `extra`."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_VARIABLES}
    return {**keep, "TORCH_CPP_LOG_LEVEL": "ERROR", **extra}


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The network's parameters in `run_dir/final.pt`, which scripts/preempt_train.py writes at the end."""
    import torch

    state = torch.load(run_dir / "final.pt", weights_only=True)
    return {k: state[k] for k in NETWORK}
