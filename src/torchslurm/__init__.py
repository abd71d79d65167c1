"""torchslurm: distributed PyTorch training on SLURM clusters that just works.

Importing the package does not import torch: `torchslurm.init()` and the trainer load it
on first use, so job scripting works on a login node without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from torchslurm.distributed import DistContext, init, shutdown
    from torchslurm.job import Job, submit
    from torchslurm.jobspec import JobSpec
    from torchslurm.trainer import TrainConfig, Trainer, seed_everything

__all__ = ["DistContext", "Job", "JobSpec", "TrainConfig", "Trainer", "__version__", "init", "seed_everything",
           "shutdown", "submit"]

_LAZY = {"init": "torchslurm.distributed", "shutdown": "torchslurm.distributed",
         "DistContext": "torchslurm.distributed",
         "submit": "torchslurm.job", "Job": "torchslurm.job", "JobSpec": "torchslurm.jobspec",
         "Trainer": "torchslurm.trainer", "TrainConfig": "torchslurm.config",
         "seed_everything": "torchslurm.trainer"}


def __getattr__(name: str) -> Any:
    """Import torch-dependent API on first use (PEP 562)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torchslurm' has no attribute {name!r}")
