"""torchslurm: distributed PyTorch training on SLURM clusters that just works.

Importing the package does not import torch: `torchslurm.init()` and the trainer load it
on first use, so job scripting works on a login node without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchslurm._version import __version__

if TYPE_CHECKING:
    from torchslurm.jobs.spec import JobSpec
    from torchslurm.jobs.submit import Job, submit
    from torchslurm.runtime.distributed import DistContext, init, shutdown
    from torchslurm.train.checkpoint.weights import load_model
    from torchslurm.train.trainer import TrainConfig, Trainer, seed_everything

__all__ = ["DistContext", "Job", "JobSpec", "TrainConfig", "Trainer", "__version__", "init", "load_model",
           "seed_everything", "shutdown", "submit"]

_LAZY = {"init": "torchslurm.runtime.distributed", "shutdown": "torchslurm.runtime.distributed",
         "DistContext": "torchslurm.runtime.distributed",
         "submit": "torchslurm.jobs.submit", "Job": "torchslurm.jobs.submit", "JobSpec": "torchslurm.jobs.spec",
         "Trainer": "torchslurm.train.trainer", "TrainConfig": "torchslurm.train.config",
         "seed_everything": "torchslurm.train.trainer", "load_model": "torchslurm.train.checkpoint.weights"}


def __getattr__(name: str) -> Any:
    """Import torch-dependent API on first use (PEP 562)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torchslurm' has no attribute {name!r}")
