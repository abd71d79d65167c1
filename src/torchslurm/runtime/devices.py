"""Which CUDA device this rank uses, decided from its environment and the visible device count.

Pure, no torch (only usable_cpus reads this process's CPU affinity): the caller passes
`torch.cuda.device_count()`. The rules follow what slurmd
(22.05) gives each task (man srun: --gpus-per-task, --gpu-bind; man cgroup.conf: ConstrainDevices),
as recorded in tests/fixtures/gpu_env:

- CUDA_VISIBLE_DEVICES holds indexes among the devices this process can see, never physical
  ones: with ConstrainDevices every task of `--gpus-per-task=1` sees `0`, and with
  `--gpu-bind=map_gpu:3,1` a task sees `3` yet torch calls that device `cuda:0`. So the device
  index is always a position among the `cuda_device_count` visible devices.
- Either all ranks of a node see the same devices (index = local rank), or each srun task sees
  only its own (per-task binding: `--gpus-per-task`, `--gpu-bind=per_task|single|map_gpu|mask_gpu`,
  inherited through SLURM_GPU_BIND; index 0, or torchrun's local rank inside that task).
- More ranks than visible devices is a ConfigError: two NCCL ranks on one GPU hang or crash.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from torchslurm import hostlist
from torchslurm.errors import ConfigError, EnvError, not_one_of
from torchslurm.runtime import gpubind
from torchslurm.runtime.variables import is_digits

__all__ = ["BACKENDS", "DEVICE_VARIABLE", "DeviceChoice", "choose_device", "container", "cpu_oversubscription",
           "cpus_per_task_lost", "gpus_unseen", "per_task_binding", "slurm_gpus", "srun_cpus_unset", "usable_cpus"]

DEVICE_VARIABLE = "TORCHSLURM_DEVICE"
"""`TORCHSLURM_DEVICE=cpu`: compute on the CPU on purpose, even where Slurm gave the job GPUs."""
DEVICE_CHOICES = ("cpu", "auto")
CONTAINER_VARIABLES = ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER")
"""Set inside an Apptainer/Singularity container (to its image), which sees the GPUs only when started with --nv."""

BACKENDS = ("gloo", "nccl")
"""The torch.distributed backends torchslurm sets up: NCCL for ranks on a CUDA device, Gloo for any."""

# --gpu-bind types that give every task its own GPUs (man srun, --gpu-bind). `closest` does not:
# tasks on one socket share the same set, so it counts as a shared view.
_TASK_BINDS = ("per_task", "single", "map_gpu", "mask_gpu")


@dataclass(frozen=True)
class DeviceChoice:
    """The device one rank should use."""

    kind: Literal["cuda", "cpu"]
    """"cuda" when this rank gets a GPU of its own, else "cpu"."""
    index: int
    """Index among the visible CUDA devices (what torch.device("cuda", index) takes); -1 on CPU."""
    reason: str
    """One sentence saying how the choice was made."""
    agree: bool = False
    """Other tasks of the node may see some of the same GPUs and no variable says which (a partial view:
    `--gpu-bind=closest`, `--accel-bind=g`): `index` is provisional, and init() lets the node's tasks
    agree on one GPU each (gpubind.agree) before the process group starts."""

    @property
    def name(self) -> str:
        """torch's spelling: "cuda:1" or "cpu"."""
        return f"cuda:{self.index}" if self.kind == "cuda" else "cpu"


def choose_device(
    environ: Mapping[str, str], local_rank: int, local_world_size: int, cuda_device_count: int
) -> DeviceChoice:
    """The device for the rank with this local placement; see the module docstring for the rules."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    wanted = environ.get(DEVICE_VARIABLE, "auto").strip().lower() or "auto"
    if wanted not in DEVICE_CHOICES:
        raise not_one_of(DEVICE_VARIABLE, environ[DEVICE_VARIABLE], DEVICE_CHOICES,
                         hint=f"{DEVICE_VARIABLE}=cpu trains on the CPU; unset it to use a GPU when there is one.")
    if wanted == "cpu":
        return DeviceChoice("cpu", -1, f"{DEVICE_VARIABLE}=cpu: using CPU")
    if cuda_device_count <= 0:
        shown = "unset" if visible is None else repr(visible)
        return DeviceChoice("cpu", -1, f"no CUDA device is visible (CUDA_VISIBLE_DEVICES {shown}); using CPU")
    slot, sharers, view = _slot(environ, local_rank, local_world_size, cuda_device_count)
    if view.startswith(_PARTIAL):
        return DeviceChoice("cuda", slot, f"cuda:{slot} of {cuda_device_count} visible: {view}", agree=True)
    if sharers > cuda_device_count or slot >= cuda_device_count:
        setting = "CUDA_VISIBLE_DEVICES unset" if visible is None else f"CUDA_VISIBLE_DEVICES={visible!r}"
        raise ConfigError(
            f"{sharers} ranks share the {cuda_device_count} CUDA device(s) visible here "
            f"({setting}, {view}); rank slot {slot} has no GPU of its own, and two "
            "NCCL ranks on one GPU hang or crash.",
            f"request one GPU per rank (--gpus-per-node="
            f"{sharers}, or --gpus-per-task=1), or start {cuda_device_count} rank(s) per node "
            f"(--ntasks-per-node={cuda_device_count} under srun, --nproc {cuda_device_count} locally)."
        )
    return DeviceChoice("cuda", slot, f"cuda:{slot} of {cuda_device_count} visible: {view}")


def slurm_gpus(environ: Mapping[str, str]) -> str:
    """The GPU variables Slurm set for this process, as 'NAME=value, ...' ('' when it gave none)."""
    names = ("SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")
    shown = [f"{n}={environ[n]}" for n in names if environ.get(n) and environ[n] not in ("0", "-1", "NoDevFiles")]
    return ", ".join(shown) if any(n.startswith("SLURM") for n in shown) else ""


def gpus_unseen(environ: Mapping[str, str], cuda_device_count: int, cuda_build: str | bool | None = False
                ) -> EnvError | None:
    """Slurm gave this process GPUs but torch sees none: training would silently run on the CPU.

    `cuda_build`: torch.version.cuda (None: a CPU-only build), or False when unknown (no torch
    imported). None when GPUs are visible, none were allocated, or TORCHSLURM_DEVICE=cpu says so."""
    allocated = slurm_gpus(environ)
    if cuda_device_count > 0 or not allocated or environ.get(DEVICE_VARIABLE, "").strip().lower() == "cpu":
        return None
    inside = container(environ)
    if cuda_build is None:
        why = "this torch is a CPU-only build"
    elif inside is not None:
        return EnvError(f"Slurm gave this task GPUs ({allocated}) but torch sees no CUDA device: this process runs in "
                        f"a container ({inside[0]}={inside[1]}) started without the GPUs; training would run on the "
                        "CPU.",
                        "start it with --nv: `apptainer exec --nv IMAGE python ...` (or set APPTAINER_NV=1); to "
                        f"train on the CPU on purpose, set {DEVICE_VARIABLE}=cpu.")
    elif isinstance(cuda_build, str):
        why = f"torch is built for CUDA {cuda_build}, so the driver sees none or CUDA_VISIBLE_DEVICES hides them"
    else:
        why = "a CPU-only torch build or a driver problem"
    return EnvError(f"Slurm gave this task GPUs ({allocated}) but torch sees no CUDA device: {why}; training would "
                    "run on the CPU.", "install a CUDA build of torch in the job's environment and check the driver "
                    f"on the node (`srun nvidia-smi`); to train on the CPU on purpose, set {DEVICE_VARIABLE}=cpu.")


def container(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(the variable, the image) of the Apptainer/Singularity container this process runs in, or None."""
    return next(((name, environ[name]) for name in CONTAINER_VARIABLES if environ.get(name)), None)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: what Slurm's cgroup or taskset allows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def omp_threads(environ: Mapping[str, str], ranks: int, cpus: int) -> str | None:
    """OMP_NUM_THREADS for each of `ranks` ranks started here: the CPUs this process may use (`cpus`,
    its affinity: taskset, a container's cpuset, a login node's cgroup) shared out, at least 1; None when
    the environment sets it. Otherwise each rank's ops start a thread per core of the machine."""
    if "OMP_NUM_THREADS" in environ:
        return None
    return str(max(1, cpus // ranks))


def cpu_oversubscription(environ: Mapping[str, str], ranks: int, cpus: int) -> ConfigError | None:
    """More ranks on this node than CPUs (or than Slurm's SLURM_CPUS_ON_NODE): legal, but every
    rank waits for a core, collectives and heartbeats time out, and training crawls."""
    slurm = environ.get("SLURM_CPUS_ON_NODE", "")
    # Inside Slurm the job's CPUs on this node count, not this process's affinity: an srun task
    # with --cpus-per-task=1 may run on one CPU while its node holds one per rank.
    limit, source = (int(slurm), f"SLURM_CPUS_ON_NODE={slurm}") if is_digits(slurm) else (
        cpus, f"{cpus} CPU(s) usable here")
    if ranks <= limit:
        return None
    return ConfigError(f"{ranks} ranks on this node but {source}: the ranks oversubscribe the CPUs, so each "
                       "waits for a core, steps are slow and timeouts (store, heartbeats, collectives) may fire.",
                       f"start at most {limit} rank(s) per node (--nproc {limit}), or ask Slurm for more CPUs "
                       f"(--cpus-per-task).")


def cpus_per_task_lost(environ: Mapping[str, str], cpus: int) -> EnvError | None:
    """An srun task running on fewer CPUs than the job's --cpus-per-task: since Slurm 22.05 srun no
    longer takes --cpus-per-task from the batch allocation (SLURM_CPUS_PER_TASK, which the task
    still inherits) unless SRUN_CPUS_PER_TASK is set, so each task gets one CPU and data loading crawls."""
    asked = _cpus_per_task(environ)
    if "SLURM_STEP_ID" not in environ or asked is None or cpus >= asked:
        return None
    return EnvError(f"this srun task may run on {cpus} CPU(s) but the job asked for SLURM_CPUS_PER_TASK={asked}: "
                    "srun (Slurm 22.05 and later) did not pass --cpus-per-task on, so data loading and the CPU "
                    "work of every rank crawl.", _srun_cpus_hint(asked))


def srun_cpus_unset(environ: Mapping[str, str]) -> EnvError | None:
    """In a batch shell that asked for several CPUs per task: what the srun steps it starts would get."""
    asked = _cpus_per_task(environ)
    if "SLURM_STEP_ID" in environ or "SLURM_JOB_ID" not in environ or asked is None:
        return None
    return EnvError(f"this job asked for SLURM_CPUS_PER_TASK={asked} but SRUN_CPUS_PER_TASK is not set: on Slurm "
                    "22.05 and later, `srun` started from this shell gives each task one CPU.", _srun_cpus_hint(asked))


def _cpus_per_task(environ: Mapping[str, str]) -> int | None:
    """SLURM_CPUS_PER_TASK when it is above 1 and srun is not told it otherwise (SRUN_CPUS_PER_TASK)."""
    asked = environ.get("SLURM_CPUS_PER_TASK", "").strip()
    if not is_digits(asked) or int(asked) <= 1 or environ.get("SRUN_CPUS_PER_TASK", "").strip():
        return None
    return int(asked)


def _srun_cpus_hint(asked: int) -> str:
    return ("export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK in the job script before srun (or `srun "
            f"--cpus-per-task={asked}`); `torchslurm script` and `submit` write it.")


def per_task_binding(environ: Mapping[str, str], cuda_device_count: int) -> str | None:
    """Why this srun task's visible GPUs are its own, or None when the node's ranks share them.

    Only inside an srun step: a batch shell also carries SLURM_GPU_BIND / SLURM_GPUS_PER_TASK,
    but Slurm applies them to the tasks it starts, not to the shell.
    """
    if "SLURM_STEP_ID" not in environ:
        return None
    asked = _asked_per_task(environ)
    if asked is not None:
        return asked
    on_node = environ.get("SLURM_GPUS_ON_NODE", "")
    if is_digits(on_node) and int(on_node) > cuda_device_count:
        # Slurm gave the step more GPUs on this node than this task sees: the rest are its peers'.
        return f"SLURM_GPUS_ON_NODE={on_node} but this task sees {cuda_device_count}"
    return None


def _asked_per_task(environ: Mapping[str, str]) -> str | None:
    """The variable by which the job asked for GPUs of each task's own (--gpus-per-task, a --gpu-bind of
    per_task/single/map_gpu/mask_gpu), as a reason; None when it asked for none."""
    tres = environ.get("SLURMD_TRES_BIND", "").removeprefix("gpu:")
    for name, value in (("SLURMD_TRES_BIND", tres), ("SLURM_GPU_BIND", environ.get("SLURM_GPU_BIND", ""))):
        kinds = [part for part in value.split(",") if part and part != "verbose"]
        if kinds and kinds[0].startswith(_TASK_BINDS):
            return f"{name}={environ[name]} binds GPUs per task"
    if environ.get("SLURM_GPUS_PER_TASK"):
        return f"SLURM_GPUS_PER_TASK={environ['SLURM_GPUS_PER_TASK']} binds GPUs per task"
    return None


def _slot(
    environ: Mapping[str, str], local_rank: int, local_world_size: int, count: int
) -> tuple[int, int, str]:
    """(my index among the processes sharing my visible devices, how many share them, why)."""
    torchrun = "TORCHELASTIC_RUN_ID" in environ
    binding = per_task_binding(environ, count)
    if binding is not None and torchrun:
        return local_rank, local_world_size, f"{binding}; torchrun local rank {local_rank} inside the task"
    if binding is not None:
        return _task_slot(environ, binding, local_rank, count)
    tasks_here = _srun_tasks_on_node(environ) if torchrun else 1
    if tasks_here > 1:
        # torchrun started by several srun tasks on one node: each torchrun numbers its workers
        # from 0, so the srun local id must offset them or two workers pick the same GPU.
        task = int(environ.get("SLURM_LOCALID", "0"))
        slot = task * local_world_size + local_rank
        return slot, tasks_here * local_world_size, (
            f"all ranks of the node see the same GPUs; srun task {task} of {tasks_here} runs torchrun "
            f"local rank {local_rank} of {local_world_size}")
    shared = f"all {local_world_size} ranks of the node see the same GPUs; local rank {local_rank}"
    return local_rank, local_world_size, shared


def _task_slot(environ: Mapping[str, str], binding: str, local_rank: int, count: int) -> tuple[int, int, str]:
    """_slot of an srun task whose visible GPUs Slurm chose for it (`binding` says how)."""
    localid = environ.get("SLURM_LOCALID", "")
    task = int(localid) if is_digits(localid) else local_rank
    listed = gpubind.task_slot(environ, task, _srun_tasks_on_node(environ), count)
    if listed is not None:
        return listed[0], 1, listed[1]
    # bound per task for no other reason than that it sees fewer GPUs than the node's step has: the GPUs
    # near its CPUs (--gpu-bind=closest, --accel-bind=g), which other tasks may see too
    if count > 1 and _asked_per_task(environ) is None:
        return task % count, 1, f"{_PARTIAL} ({binding}): task {task} provisionally takes its {task % count}"
    return 0, 1, f"{binding}, so this task uses its first"


_PARTIAL = "a part of the node's GPUs that other tasks may share"


def _srun_tasks_on_node(environ: Mapping[str, str]) -> int:
    """srun tasks of this step on this node (1 outside an srun step)."""
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE")
    node = environ.get("SLURM_NODEID", "0")
    if "SLURM_STEP_ID" not in environ or not per_node or not is_digits(node):
        return 1
    counts = hostlist.expand_counts(per_node)
    return counts[int(node)] if int(node) < len(counts) else 1
