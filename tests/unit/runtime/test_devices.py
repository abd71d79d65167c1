"""torchslurm.runtime.devices: every environment slurmd gave a task in tests/fixtures/gpu_env, plus pure cases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchslurm.errors import ConfigError
from torchslurm.runtime.devices import (
    DeviceChoice,
    choose_device,
    cpus_per_task_lost,
    gpus_unseen,
    per_task_binding,
    srun_cpus_unset,
)

FIXTURES = Path(__file__).parents[2] / "fixtures"


def _cases(folder: str) -> list[Any]:
    cases = []
    for path in sorted((FIXTURES / folder).glob("*.json")):
        data = json.loads(path.read_text())
        for number, task in enumerate(data.get("tasks", [])):
            if "expect" in task:
                cases.append(pytest.param(task, id=f"{path.stem}-task{number}"))
    return cases


GPU_ENV_CASES = _cases("gpu_env")  # each task of each recorded step (tests/fixtures/gpu_env/README.md)
SANDBOX_CASES = _cases("slurm_env")  # recorded on the sandbox cluster by tests/cluster/test_runtime_e2e.py


def test_every_lab_row_has_a_fixture() -> None:
    assert len(list((FIXTURES / "gpu_env").glob("*.json"))) == 26
    assert len(GPU_ENV_CASES) == 92
    assert len(SANDBOX_CASES) >= 16


@pytest.mark.parametrize("task", GPU_ENV_CASES + SANDBOX_CASES)
def test_recorded_slurm_gpu_environments(task: dict[str, Any]) -> None:
    args = (task["environ"], task["local_rank"], task["local_world_size"], task["cuda_device_count"])
    expect = task["expect"]
    if "error" in expect:
        with pytest.raises(ConfigError, match=expect["error"]):
            choose_device(*args)
        return
    choice = choose_device(*args)
    assert (choice.kind, choice.index) == (expect["kind"], expect["index"]), choice.reason


STEP = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_NODEID": "0", "SLURM_LOCALID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}


def test_no_gpu_is_cpu() -> None:
    choice = choose_device({"CUDA_VISIBLE_DEVICES": ""}, 1, 2, 0)
    assert choice == DeviceChoice("cpu", -1, "no CUDA device is visible (CUDA_VISIBLE_DEVICES ''); using CPU")
    assert choice.name == "cpu"


def test_all_visible_uses_local_rank() -> None:
    choice = choose_device({}, 3, 4, 4)
    assert (choice.name, choice.reason) == ("cuda:3", "cuda:3 of 4 visible: all 4 ranks of the node see the "
                                            "same GPUs; local rank 3")


def test_more_ranks_than_gpus_is_an_error_with_the_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        choose_device({**STEP, "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_GPUS_ON_NODE": "2"}, 3, 4, 2)
    message = str(caught.value)
    assert "4 ranks share the 2 CUDA device(s) visible here (CUDA_VISIBLE_DEVICES='0,1'" in message
    assert "HINT: request one GPU per rank (--gpus-per-node=4, or --gpus-per-task=1)" in message
    assert "--ntasks-per-node=2 under srun, --nproc 2 locally" in message


def test_two_tasks_on_one_shared_gpu_fail_even_for_local_rank_zero() -> None:
    with pytest.raises(ConfigError, match="2 ranks share the 1 CUDA device"):
        choose_device({**STEP, "CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "1"}, 0, 2, 1)


def test_physical_index_in_cvd_is_never_used() -> None:
    env = {**STEP, "CUDA_VISIBLE_DEVICES": "3", "SLURMD_TRES_BIND": "gpu:map_gpu:3,1"}
    assert choose_device(env, 0, 2, 1).name == "cuda:0"


def test_gpu_bind_closest_is_a_shared_view() -> None:
    env = {**STEP, "CUDA_VISIBLE_DEVICES": "0,1", "SLURMD_TRES_BIND": "gpu:closest", "SLURM_GPUS_ON_NODE": "2"}
    assert per_task_binding(env, 2) is None
    with pytest.raises(ConfigError):
        choose_device(env, 1, 4, 2)


def test_gpu_bind_verbose_prefix_still_binds() -> None:
    env = {**STEP, "CUDA_VISIBLE_DEVICES": "1", "SLURM_GPU_BIND": "verbose,per_task:1"}
    assert per_task_binding(env, 1) == "SLURM_GPU_BIND=verbose,per_task:1 binds GPUs per task"


def test_batch_shell_ignores_task_binding_variables() -> None:
    shell = {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_GPUS_PER_TASK": "1"}
    assert per_task_binding(shell, 2) is None
    assert choose_device(shell, 0, 1, 2).name == "cuda:0"


def test_torchrun_inside_a_per_task_srun_step_uses_its_local_rank() -> None:
    env = {**STEP, "TORCHELASTIC_RUN_ID": "7", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
           "CUDA_VISIBLE_DEVICES": "4,5,6,7", "SLURMD_TRES_BIND": "gpu:per_task:4"}
    assert choose_device(env, 2, 4, 4).name == "cuda:2"
    with pytest.raises(ConfigError, match="5 ranks share the 4"):
        choose_device(env, 4, 5, 4)


def test_torchrun_in_two_srun_tasks_of_one_node_offsets_by_task() -> None:
    env = {**STEP, "TORCHELASTIC_RUN_ID": "7", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4"}
    # srun task 1 (SLURM_LOCALID=1) runs torchrun with 2 workers: its local rank 0 takes GPU 2.
    assert choose_device(env, 0, 2, 4).name == "cuda:2"
    assert choose_device(env, 1, 2, 4).name == "cuda:3"
    with pytest.raises(ConfigError, match="6 ranks share the 4"):
        choose_device(env, 0, 3, 4)


def test_gpus_on_node_above_visible_count_means_per_task() -> None:
    env = {**STEP, "CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "2"}
    assert per_task_binding(env, 1) == "SLURM_GPUS_ON_NODE=2 but this task sees 1"
    assert choose_device(env, 1, 2, 1).name == "cuda:0"



def test_more_ranks_than_gpus_with_cuda_visible_devices_unset_says_unset() -> None:
    with pytest.raises(ConfigError, match=r"2 ranks share the 1 CUDA device\(s\) visible here \(CUDA_VISIBLE_DEVICES "
                                          r"unset, "):
        choose_device({}, local_rank=1, local_world_size=2, cuda_device_count=1)


# ---- GPUs from Slurm that torch does not see; the CPU on purpose --------------------------------

GPU_TASK = {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_GPUS": "0,1",
            "CUDA_VISIBLE_DEVICES": "0,1"}


def test_slurm_gpus_that_torch_does_not_see_are_named_with_the_likely_cause() -> None:
    cpu_build = gpus_unseen(GPU_TASK, 0, None)
    assert cpu_build is not None
    assert cpu_build.message.startswith("Slurm gave this task GPUs (SLURM_GPUS_ON_NODE=2, SLURM_JOB_GPUS=0,1, "
                                        "CUDA_VISIBLE_DEVICES=0,1) but torch sees no CUDA device: this torch is a "
                                        "CPU-only build; training would run on the CPU.")
    assert cpu_build.hint is not None and "TORCHSLURM_DEVICE=cpu" in cpu_build.hint
    driver = gpus_unseen(GPU_TASK, 0, "12.8")
    assert driver is not None and "built for CUDA 12.8, so the driver sees none" in driver.message
    unknown = gpus_unseen(GPU_TASK, 0)
    assert unknown is not None and "a CPU-only torch build or a driver problem" in unknown.message


@pytest.mark.parametrize(("environ", "visible"), [
    (GPU_TASK, 2),                                    # torch sees them
    ({"SLURM_JOB_ID": "5", "CUDA_VISIBLE_DEVICES": "0"}, 0),  # not from Slurm
    ({**GPU_TASK, "TORCHSLURM_DEVICE": "cpu"}, 0),    # the CPU on purpose
])
def test_no_warning_when_gpus_are_seen_not_allocated_or_the_cpu_is_wanted(environ: dict[str, str],
                                                                         visible: int) -> None:
    assert gpus_unseen(environ, visible, None) is None


def test_torchslurm_device_cpu_chooses_the_cpu_even_with_gpus_and_other_values_are_refused() -> None:
    assert choose_device({**GPU_TASK, "TORCHSLURM_DEVICE": "cpu"}, 0, 1, 2).name == "cpu"
    assert choose_device({**GPU_TASK, "TORCHSLURM_DEVICE": "auto"}, 1, 2, 2).name == "cuda:1"
    with pytest.raises(ConfigError, match=r"TORCHSLURM_DEVICE='gpu'.*cpu, auto"):
        choose_device({"TORCHSLURM_DEVICE": "gpu"}, 0, 1, 2)


# What an srun task of `#SBATCH --cpus-per-task=4` + a plain `srun` inherits on Slurm >= 22.05: the batch
# shell's SLURM_CPUS_PER_TASK, while srun itself gave the task one CPU.
CPU_TASK = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_CPUS_PER_TASK": "4"}


@pytest.mark.parametrize(("environ", "cpus", "lost"), [
    (CPU_TASK, 1, True),
    (CPU_TASK, 4, False),                                       # srun -c 4, or Slurm < 22.05
    ({**CPU_TASK, "SRUN_CPUS_PER_TASK": "4"}, 1, False),        # told: whatever binds it, not this
    ({**CPU_TASK, "SLURM_CPUS_PER_TASK": "1"}, 1, False),
    ({k: v for k, v in CPU_TASK.items() if k != "SLURM_STEP_ID"}, 1, False),  # the batch shell itself
])
def test_an_srun_task_on_fewer_cpus_than_the_job_asked_for(environ: dict[str, str], cpus: int, lost: bool) -> None:
    problem = cpus_per_task_lost(environ, cpus)
    assert (problem is not None) is lost
    if problem is not None:
        assert "on 1 CPU(s) but the job asked for SLURM_CPUS_PER_TASK=4" in problem.message
        assert problem.hint and "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK" in problem.hint


def test_a_batch_shell_without_srun_cpus_per_task_says_what_its_steps_would_get() -> None:
    shell = {"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "4"}
    problem = srun_cpus_unset(shell)
    assert problem is not None and "SRUN_CPUS_PER_TASK is not set" in problem.message
    assert srun_cpus_unset({**shell, "SRUN_CPUS_PER_TASK": "4"}) is None
    assert srun_cpus_unset(CPU_TASK) is None and srun_cpus_unset({"SLURM_CPUS_PER_TASK": "4"}) is None


def test_a_partial_view_without_a_per_task_request_is_provisional_and_agreed_at_init() -> None:
    """`--gpu-bind=closest` on a node whose GPUs sit on two sockets: the task sees 2 of the step's 4 GPUs and
    no variable says which tasks share them; the sandbox (no topology) shows every task all 4 instead."""
    closest = {**STEP, "SLURM_LOCALID": "3", "SLURM_STEP_TASKS_PER_NODE": "4", "SLURMD_TRES_BIND": "gpu:closest",
               "SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "2,3"}
    partial = choose_device(closest, 3, 4, 2)
    assert (partial.index, partial.agree) == (1, True) and "other tasks may share" in partial.reason
    whole = choose_device({**closest, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 3, 4, 4)
    assert (whole.index, whole.agree) == (3, False)
    own = choose_device({**closest, "SLURM_GPUS_PER_TASK": "2"}, 3, 4, 2)  # --gpus-per-task=2: its own two
    assert (own.index, own.agree) == (0, False)
