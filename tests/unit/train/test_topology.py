"""Where the Trainer trains: from torchslurm.init()'s context, from a process group of the caller's own,
or one local process."""

from __future__ import annotations

import torch

from torchslurm.runtime.distenv import detect
from torchslurm.runtime.distributed import DistContext
from torchslurm.train.topology import Topology, topology


def test_one_local_process_without_a_group() -> None:
    assert topology(None, {}) == Topology(0, 1, 0, torch.device("cpu"), "none", 1, 1, "local")


def test_a_group_of_the_callers_own_with_torchrun_variables(one_rank_group: None) -> None:
    found = topology(None, {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"})
    assert found == Topology(0, 1, 0, torch.device("cpu"), "gloo", 1, 1, "n1:29500")
    assert topology(None, {}).master == "?:?"


def test_the_context_of_init_is_the_truth() -> None:
    env = detect({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
                  "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
                  "SLURM_STEP_NODELIST": "gpu[07-08]"})
    ctx = DistContext(env=env, device=torch.device("cpu"), backend="gloo", interface_env={})
    found = topology(ctx, {"LOCAL_RANK": "7"})  # the environ is not read when a context is given
    assert (found.rank, found.world_size, found.local_rank, found.num_nodes, found.local_world_size) == (5, 8, 1, 2, 4)
    assert found.master == f"gpu07:{env.master_port}" and found.backend == "gloo"
