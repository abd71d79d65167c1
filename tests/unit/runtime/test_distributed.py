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


def test_a_fixed_master_port_in_use_says_so_at_once_with_the_fix() -> None:
    """A real listener holds the port; init() as a lone local rank with MASTER_PORT set to it."""
    import socket

    from torchslurm.errors import DistributedError
    from torchslurm.runtime.distributed import init

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        environ = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"}
        with pytest.raises(DistributedError) as info:
            init(backend="gloo", timeout_s=60, environ=environ)
    message = str(info.value)
    assert f"rank 0 could not start the store: port {port} on {socket.gethostname()} is already in use, by another " \
           f"process on this machine (MASTER_PORT={port} is set)." in message
    assert "HINT: unset MASTER_PORT" in message and "within" not in message and "likely causes" not in message


def test_a_port_taken_inside_slurm_names_another_job() -> None:
    from torchslurm.runtime.distenv import detect
    from torchslurm.runtime.distributed import port_taken

    env = detect({"SLURM_JOB_ID": "12"}, free_port=lambda: 0)
    error = port_taken(env, {"SLURM_JOB_ID": "12"}, "node1")
    assert f"port {env.master_port} on node1 is already in use, by another job or process on this node " \
           "(torchslurm derived the port from the job id)" in error.message
    assert error.hint is not None and f"ss -ltnp 'sport = :{env.master_port}'" in error.hint
