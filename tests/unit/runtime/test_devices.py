"""torchslurm.runtime.devices: every environment slurmd gave a task in tests/fixtures/gpu_env, plus pure cases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchslurm.errors import ConfigError
from torchslurm.runtime import devices
from torchslurm.runtime.devices import (
    DeviceChoice,
    choose_device,
    container,
    cpu_oversubscription,
    cpus_per_task_lost,
    gpus_unseen,
    omp_threads,
    per_task_binding,
    slurm_gpus,
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


@pytest.mark.parametrize("variable", ["APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"])
def test_gpus_unseen_in_a_container_started_without_nv_say_so(variable: str) -> None:
    inside = {**GPU_TASK, variable: "/images/pytorch.sif"}
    for build in ("12.8", False):
        unseen = gpus_unseen(inside, 0, build)
        assert unseen is not None and (unseen.message, unseen.hint) == (
            "Slurm gave this task GPUs (SLURM_GPUS_ON_NODE=2, SLURM_JOB_GPUS=0,1, CUDA_VISIBLE_DEVICES=0,1) but "
            f"torch sees no CUDA device: this process runs in a container ({variable}=/images/pytorch.sif) started "
            "without the GPUs; training would run on the CPU.",
            "start it with --nv: `apptainer exec --nv IMAGE python ...` (or set APPTAINER_NV=1); to train on the "
            "CPU on purpose, set TORCHSLURM_DEVICE=cpu.")
    cpu_build = gpus_unseen(inside, 0, None)  # a CPU-only torch sees no GPU in or out of a container
    assert cpu_build is not None and "this torch is a CPU-only build" in cpu_build.message
    assert gpus_unseen({**GPU_TASK, variable: ""}, 0, "12.8").message.endswith(  # type: ignore[union-attr]
        "so the driver sees none or CUDA_VISIBLE_DEVICES hides them; training would run on the CPU.")
    assert gpus_unseen(inside, 2, "12.8") is None  # started with --nv
    assert container(inside) == (variable, "/images/pytorch.sif") and container(GPU_TASK) is None


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


# ---- every rule at its edges, and the whole text of what each says ---------------------------------

def test_torchslurm_device_empty_is_auto_and_a_wrong_value_gets_the_fix() -> None:
    assert choose_device({"TORCHSLURM_DEVICE": " "}, 1, 2, 2).name == "cuda:1"
    assert choose_device({"TORCHSLURM_DEVICE": "CPU"}, 0, 1, 2) == DeviceChoice("cpu", -1,
                                                                                "TORCHSLURM_DEVICE=cpu: using CPU")
    with pytest.raises(ConfigError) as info:
        choose_device({"TORCHSLURM_DEVICE": "gpu"}, 0, 1, 2)
    assert info.value.hint == "TORCHSLURM_DEVICE=cpu trains on the CPU; unset it to use a GPU when there is one."


def test_no_cuda_device_with_cuda_visible_devices_unset_says_unset() -> None:
    assert choose_device({}, 0, 1, 0).reason == "no CUDA device is visible (CUDA_VISIBLE_DEVICES unset); using CPU"


def test_more_ranks_than_gpus_says_the_whole_problem_and_fix() -> None:
    with pytest.raises(ConfigError) as info:
        choose_device({"CUDA_VISIBLE_DEVICES": "0"}, 1, 2, 1)
    assert str(info.value) == (
        "2 ranks share the 1 CUDA device(s) visible here (CUDA_VISIBLE_DEVICES='0', all 2 ranks of the node see the "
        "same GPUs; local rank 1); rank slot 1 has no GPU of its own, and two NCCL ranks on one GPU hang or crash. "
        "HINT: request one GPU per rank (--gpus-per-node=2, or --gpus-per-task=1), or start 1 rank(s) per node "
        "(--ntasks-per-node=1 under srun, --nproc 1 locally).")


TORCHRUN_STEP = {**STEP, "TORCHELASTIC_RUN_ID": "7", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4"}


@pytest.mark.parametrize(("changes", "slot"), [
    ({}, "cuda:2"),                                                          # task 1 of 2 on node 0
    ({"SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "2,1"}, "cuda:0"),   # node 1 has one task: no offset
    ({"SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "2,1"}, "cuda:0"),   # past the list: one task
    ({"SLURM_STEP_TASKS_PER_NODE": "2"}, "cuda:2"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": None}, "cuda:2"),    # node 0 unless said otherwise
    ({"SLURM_LOCALID": None}, "cuda:0"),                                     # task 0 unless said otherwise
    ({"SLURM_STEP_TASKS_PER_NODE": None}, "cuda:0"),                         # one task unless said otherwise
    ({"SLURM_STEP_ID": None}, "cuda:0"),                                     # the batch shell: no srun tasks
])
def test_torchrun_workers_offset_by_the_srun_tasks_on_their_node(changes: dict[str, str | None], slot: str) -> None:
    env = {**TORCHRUN_STEP, **changes}
    choice = choose_device({k: v for k, v in env.items() if v is not None}, 0, 2, 4)
    assert choice.name == slot, choice.reason


def test_the_reason_of_a_torchrun_worker_offset_by_its_task() -> None:
    assert choose_device(TORCHRUN_STEP, 1, 2, 4).reason == (
        "cuda:3 of 4 visible: all ranks of the node see the same GPUs; srun task 1 of 2 runs torchrun local rank 1 "
        "of 2")


def test_a_task_id_past_its_nodes_tasks_never_picks_a_device_past_the_visible_ones() -> None:
    """Inconsistent variables (SLURM_LOCALID=2 of 2 tasks) would make slot 2 of 2 GPUs: refused."""
    env = {**TORCHRUN_STEP, "SLURM_LOCALID": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "CUDA_VISIBLE_DEVICES": "0,1",
           "SLURM_GPUS_ON_NODE": "2"}
    with pytest.raises(ConfigError, match=r"^2 ranks share the 2 CUDA device\(s\) visible here .*rank slot 2 has no "):
        choose_device(env, 0, 1, 2)


@pytest.mark.parametrize(("environ", "index", "reason"), [
    ({"SLURM_GPU_BIND": "per_task:2"}, 0, "SLURM_GPU_BIND=per_task:2 binds GPUs per task, so this task uses its first"),
    ({"SLURM_GPU_BIND": "verbose,per_task:2"}, 0,
     "SLURM_GPU_BIND=verbose,per_task:2 binds GPUs per task, so this task uses its first"),
    ({"SLURM_GPUS_PER_TASK": "2"}, 0, "SLURM_GPUS_PER_TASK=2 binds GPUs per task, so this task uses its first"),
    ({}, 1, "a part of the node's GPUs that other tasks may share (SLURM_GPUS_ON_NODE=4 but this task sees 2): task 3 "
            "provisionally takes its 1"),
])
def test_a_task_that_sees_part_of_the_nodes_gpus_takes_its_first_unless_nothing_asked_for_that(
        environ: dict[str, str], index: int, reason: str) -> None:
    env = {**STEP, "SLURM_LOCALID": "3", "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_GPUS_ON_NODE": "4",
           "CUDA_VISIBLE_DEVICES": "2,3", **environ}
    choice = choose_device(env, 3, 4, 2)
    assert (choice.kind, choice.index, choice.agree, choice.reason) == ("cuda", index, not environ,
                                                                        f"cuda:{index} of 2 visible: {reason}")


def test_a_task_that_sees_one_of_the_nodes_gpus_takes_it_without_agreeing() -> None:
    env = {**STEP, "CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "2"}
    choice = choose_device(env, 1, 2, 1)
    assert (choice.index, choice.agree) == (0, False)
    assert choice.reason == ("cuda:0 of 1 visible: SLURM_GPUS_ON_NODE=2 but this task sees 1, so this task uses its "
                             "first")


@pytest.mark.parametrize(("localid", "local_rank", "reason"), [
    ("1", 0, "local task 1 takes GPU 1 of its 1"),   # Slurm's task id, not the rank's guess
    (None, 1, "local task 1 takes GPU 1 of its 1"),  # no task id: the local rank
    ("x", 1, "local task 1 takes GPU 1 of its 1"),
])
def test_a_bind_list_is_read_for_this_tasks_slurm_id(localid: str | None, local_rank: int, reason: str) -> None:
    env = {**STEP, "CUDA_VISIBLE_DEVICES": "1", "SLURMD_TRES_BIND": "gpu:map_gpu:3,1", "SLURM_LOCALID": localid}
    choice = choose_device({k: v for k, v in env.items() if v is not None}, local_rank, 2, 1)
    assert choice.reason == f"cuda:0 of 1 visible: SLURMD_TRES_BIND=gpu:map_gpu:3,1: {reason}"


def test_slurm_gpus_names_slurms_own_variables_and_skips_empty_values() -> None:
    assert slurm_gpus({"SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}) == (
        "SLURM_STEP_GPUS=2,3, CUDA_VISIBLE_DEVICES=0,1")
    for empty in ("0", "-1", "NoDevFiles", ""):
        assert slurm_gpus({"SLURM_GPUS_ON_NODE": empty, "SLURM_JOB_GPUS": "1"}) == "SLURM_JOB_GPUS=1"
    assert slurm_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == ""  # not from Slurm


def test_gpus_unseen_says_the_whole_text_and_is_silent_with_one_gpu_seen() -> None:
    problem = gpus_unseen(GPU_TASK, 0)
    assert problem is not None and str(problem) == (
        "Slurm gave this task GPUs (SLURM_GPUS_ON_NODE=2, SLURM_JOB_GPUS=0,1, CUDA_VISIBLE_DEVICES=0,1) but torch "
        "sees no CUDA device: a CPU-only torch build or a driver problem; training would run on the CPU. HINT: "
        "install a CUDA build of torch in the job's environment and check the driver on the node (`srun "
        "nvidia-smi`); to train on the CPU on purpose, set TORCHSLURM_DEVICE=cpu.")
    assert gpus_unseen(GPU_TASK, 1) is None


def test_cpus_per_task_lost_says_the_whole_text() -> None:
    problem = cpus_per_task_lost({**CPU_TASK, "SLURM_CPUS_PER_TASK": "2"}, 1)
    assert problem is not None and str(problem) == (
        "this srun task may run on 1 CPU(s) but the job asked for SLURM_CPUS_PER_TASK=2: srun (Slurm 22.05 and "
        "later) did not pass --cpus-per-task on, so data loading and the CPU work of every rank crawl. HINT: export "
        "SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK in the job script before srun (or `srun --cpus-per-task=2`); "
        "`torchslurm script` and `submit` write it.")


@pytest.mark.parametrize("asked", [None, "", "abc", "1", " "])
def test_no_cpus_per_task_above_one_means_nothing_is_lost(asked: str | None) -> None:
    environ = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"} | ({} if asked is None else {"SLURM_CPUS_PER_TASK": asked})
    assert cpus_per_task_lost(environ, 1) is None
    assert srun_cpus_unset({k: v for k, v in environ.items() if k != "SLURM_STEP_ID"}) is None


def test_srun_cpus_unset_says_the_whole_text() -> None:
    problem = srun_cpus_unset({"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "3"})
    assert problem is not None and str(problem) == (
        "this job asked for SLURM_CPUS_PER_TASK=3 but SRUN_CPUS_PER_TASK is not set: on Slurm 22.05 and later, "
        "`srun` started from this shell gives each task one CPU. HINT: export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK "
        "in the job script before srun (or `srun --cpus-per-task=3`); `torchslurm script` and `submit` write it.")


@pytest.mark.parametrize(("environ", "ranks", "cpus", "limit"), [
    ({}, 4, 4, None), ({}, 5, 4, "4 CPU(s) usable here"),
    ({"SLURM_CPUS_ON_NODE": "8"}, 5, 4, None),  # the node's CPUs in Slurm, not this process's affinity
    ({"SLURM_CPUS_ON_NODE": "2"}, 3, 16, "SLURM_CPUS_ON_NODE=2"), ({"SLURM_CPUS_ON_NODE": "2"}, 2, 1, None),
    ({"SLURM_CPUS_ON_NODE": "x"}, 5, 4, "4 CPU(s) usable here"),
])
def test_more_ranks_than_cpus_on_a_node_is_said_with_the_limit(environ: dict[str, str], ranks: int, cpus: int,
                                                               limit: str | None) -> None:
    problem = cpu_oversubscription(environ, ranks, cpus)
    if limit is None:
        assert problem is None
        return
    number = limit.split("=")[-1].split(" ")[0]
    assert problem is not None and str(problem) == (
        f"{ranks} ranks on this node but {limit}: the ranks oversubscribe the CPUs, so each waits for a core, steps "
        "are slow and timeouts (store, heartbeats, collectives) may fire. HINT: start at most "
        f"{number} rank(s) per node (--nproc {number}), or ask Slurm for more CPUs (--cpus-per-task).")


@pytest.mark.parametrize(("environ", "ranks", "cpus", "threads"), [
    ({}, 4, 128, "32"), ({}, 4, 8, "2"),  # salloc -c 8 on a 128-core node: the 8 usable CPUs are shared out
    ({}, 3, 8, "2"), ({}, 8, 4, "1"), ({}, 1, 1, "1"),  # at least one thread a rank
    ({"OMP_NUM_THREADS": "6"}, 4, 128, None), ({"OMP_NUM_THREADS": ""}, 4, 128, None),  # the user's own
])
def test_each_local_rank_gets_its_share_of_the_usable_cpus_as_threads(environ: dict[str, str], ranks: int,
                                                                     cpus: int, threads: str | None) -> None:
    assert omp_threads(environ, ranks, cpus) == threads


def test_per_task_binding_by_gpus_per_task() -> None:
    assert per_task_binding({**STEP, "SLURM_GPUS_PER_TASK": "1"}, 1) == "SLURM_GPUS_PER_TASK=1 binds GPUs per task"


def test_usable_cpus_falls_back_to_the_cpu_count_where_there_is_no_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_affinity(pid: int) -> set[int]:
        raise OSError("not here")

    monkeypatch.setattr(devices.os, "sched_getaffinity", no_affinity)
    monkeypatch.setattr(devices.os, "cpu_count", lambda: 8)
    assert devices.usable_cpus() == 8
    monkeypatch.setattr(devices.os, "cpu_count", lambda: None)  # os.cpu_count(): None when it cannot tell
    assert devices.usable_cpus() == 1
