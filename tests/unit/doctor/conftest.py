"""What the doctor's tests share: recorded facts of a sandbox node and the Slurm environments of a job."""

from __future__ import annotations

from typing import Any

from torchslurm.doctor.checks import SLURM_COMMANDS
from torchslurm.doctor.facts import Check, Facts, TorchFacts
from torchslurm.runtime.netif import IfAddr

CPU_TORCH = TorchFacts(version="2.13.0+cpu", cuda=None, cuda_device_count=0, nccl=None, gloo=True)
GPU_TORCH = TorchFacts(version="2.13.0", cuda="12.8", cuda_device_count=4, nccl="2.27.3", gloo=True)
NODE1 = (IfAddr("lo", "127.0.0.1"), IfAddr("eth0", "198.18.0.11"))
NODE2 = (IfAddr("lo", "127.0.0.1"), IfAddr("ens1f0", "198.18.0.12"))
ALL_COMMANDS = {name: f"/usr/bin/{name}" for name in SLURM_COMMANDS}

# An srun task of a 2-node x 2-task step, as slurmd 22.05 sets it (subset), and the job's batch shell.
SRUN = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "node[1-2]", "PATH": "/usr/bin"}
BATCH = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "4", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
         "SLURM_JOB_NODELIST": "node[1-2]", "PATH": "/usr/bin"}


def facts(environ: dict[str, str], **kw: Any) -> Facts:
    """node2 of the sandbox reaching node1 (the master) over ens1f0, every Slurm command on PATH,
    unless overridden."""
    defaults: dict[str, Any] = {"hostname": "node2", "torch": CPU_TORCH, "interfaces": NODE2,
                                "master_ips": ("198.18.0.11",), "source": "198.18.0.12",
                                "own_addresses": ("198.18.0.12",), "commands": ALL_COMMANDS}
    return Facts(environ=environ, **{**defaults, **kw})


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def assert_actionable(check: Check, *names: str) -> None:
    """A failure or warning names the variables it is about and says how to fix it."""
    for name in names:
        assert name in check.detail, check
    assert check.hint, check
