"""Backend choice: NCCL only where there is a GPU; explicit choices are checked."""

from __future__ import annotations

import pytest
import torch

from torchslurm.errors import ConfigError
from torchslurm.runtime.distributed import choose_backend

CPU, GPU = torch.device("cpu"), torch.device("cuda", 1)


def test_default_follows_the_device() -> None:
    assert (choose_backend(None, CPU), choose_backend(None, GPU)) == ("gloo", "nccl")


def test_gloo_may_be_forced_on_a_gpu() -> None:
    assert choose_backend("gloo", GPU) == "gloo"


def test_nccl_without_cuda_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"TORCHSLURM_BACKEND='nccl' but this rank has no CUDA device.*HINT: use"):
        choose_backend("nccl", CPU, setting="TORCHSLURM_BACKEND")


def test_unknown_backend_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"backend=.mpi. is not one of gloo, nccl\. HINT: leave backend unset"):
        choose_backend("mpi", CPU)
