"""torchslurm.doctor.checks on plain dicts and recorded facts: placement, GPUs, backend, torch, NCCL's
environment, Slurm commands and controller, and the whole report (the network checks: test_netcheck)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.unit.doctor.conftest import (
    BATCH,
    CPU_TORCH,
    GPU_TORCH,
    SRUN,
    assert_actionable,
    by_name,
    facts,
)

from torchslurm.doctor import checks as doctor
from torchslurm.doctor.checks import TorchFacts

SLURM_ENV = Path(__file__).parents[2] / "fixtures" / "slurm_env"



# ---- placement ---------------------------------------------------------------------------------


def test_srun_task_placement_is_ok_and_names_the_launcher() -> None:
    check = doctor.check_placement(facts(SRUN))
    assert (check.status, check.value) == ("ok", "srun")
    assert "srun task 2 of 4" in check.detail


def test_python_without_srun_in_a_multi_task_allocation_warns_one_gpu_of_many() -> None:
    check = doctor.check_placement(facts(BATCH))
    assert (check.status, check.value) == ("warning", "batch")
    assert_actionable(check, "SLURM_NTASKS=4", "not started by srun")
    assert "srun python train.py" in check.hint and "srun torchslurm doctor" in check.hint


def test_rank_exported_in_the_job_script_fails_placement_and_skips_what_depends_on_it() -> None:
    env = {**SRUN, "RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "node1", "MASTER_PORT": "1234"}
    checks = by_name(doctor.run_checks(facts(env)))
    assert checks["placement"].status == "error"
    assert_actionable(checks["placement"], "RANK=0", "SLURM_PROCID=2")
    assert "export RANK" in checks["placement"].hint
    assert {checks[n].status for n in ("gpus", "master_addr", "master_port", "gloo_socket_ifname")} == {"warning"}
    assert "not checked" in checks["gpus"].detail


# ---- GPUs --------------------------------------------------------------------------------------


def test_cpu_task_without_gpus_is_ok() -> None:
    check = doctor.check_gpus(facts(SRUN))
    assert (check.status, check.value) == ("ok", "cpu")


def test_each_recorded_per_task_binding_gets_its_own_gpu() -> None:
    recorded = json.loads((SLURM_ENV / "srun_gpus_per_task1.json").read_text())
    for task in recorded["tasks"]:
        torch = TorchFacts("2.13.0", "12.8", task["cuda_device_count"], "2.27.3", True)
        check = doctor.check_gpus(facts(task["environ"], torch=torch))
        assert (check.status, check.value) == ("ok", "cuda:0"), check


def test_one_rank_per_node_with_four_visible_gpus_warns_idle_gpus() -> None:
    env = {**SRUN, "SLURM_PROCID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
           "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4"}
    check = doctor.check_gpus(facts(env, torch=GPU_TORCH))
    assert (check.status, check.value) == ("warning", "cuda:0")
    assert_actionable(check, "CUDA_VISIBLE_DEVICES='0,1,2,3'", "3 GPU(s) idle")
    assert "--ntasks-per-node=4" in check.hint


def test_more_ranks_than_gpus_fails_with_the_runtimes_message() -> None:
    env = {**SRUN, "CUDA_VISIBLE_DEVICES": "0"}
    check = doctor.check_gpus(facts(env, torch=TorchFacts("2.13.0", "12.8", 1, "2.27.3", True)))
    assert check.status == "error"
    assert_actionable(check, "CUDA_VISIBLE_DEVICES='0'", "2 ranks share")
    assert "--gpus-per-node=2" in check.hint


def test_slurm_gpus_but_cpu_only_torch_warns() -> None:
    env = {**SRUN, "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_GPUS_ON_NODE": "2", "SLURM_STEP_GPUS": "0,1"}
    check = doctor.check_gpus(facts(env))
    assert check.status == "warning"
    assert_actionable(check, "SLURM_GPUS_ON_NODE=2", "CPU-only build")


def test_slurm_gpus_but_cpu_only_torch_says_how_to_train_on_the_cpu_on_purpose() -> None:
    env = {**SRUN, "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_GPUS_ON_NODE": "2"}
    check = doctor.check_gpus(facts(env))
    assert "this torch is a CPU-only build; training would run on the CPU" in check.detail
    assert "TORCHSLURM_DEVICE=cpu" in check.hint
    on_purpose = doctor.check_gpus(facts({**env, "TORCHSLURM_DEVICE": "cpu"}))
    assert (on_purpose.status, on_purpose.value) == ("ok", "cpu") and "TORCHSLURM_DEVICE=cpu" in on_purpose.detail


def test_torchrun_standalone_on_every_node_of_a_step_fails_placement() -> None:
    """`srun -N2 torchrun --standalone --nproc-per-node=2`: each node forms its own 2-rank world."""
    env = {**SRUN, "SLURM_STEP_NUM_NODES": "2", "TORCHELASTIC_RUN_ID": "none", "RANK": "0", "LOCAL_RANK": "0",
           "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
           "MASTER_ADDR": "localhost", "MASTER_PORT": "29400"}
    check = by_name(doctor.run_checks(facts(env)))["placement"]
    assert check.status == "error"
    assert_actionable(check, "WORLD_SIZE=2", "SLURM_STEP_NUM_NODES=2", "separate training")
    assert "--nnodes=2" in check.hint


def test_rank_exported_alone_names_the_export_as_the_cause() -> None:
    check = by_name(doctor.run_checks(facts({**SRUN, "SLURM_PROCID": "0", "RANK": "0"})))["placement"]
    assert check.status == "error" and "the job script exports RANK" in check.detail
    assert "remove the `export RANK=…` line" in check.hint


def test_batch_shell_compares_tasks_per_node_with_gpus_per_node() -> None:
    few = doctor.check_gpus(facts({**BATCH, "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_GPUS_ON_NODE": "4"},
                                  torch=GPU_TORCH))
    assert few.status == "warning"
    assert_actionable(few, "SLURM_GPUS_ON_NODE=4", "SLURM_TASKS_PER_NODE=1(x2)", "3 GPU(s) stay idle")
    assert "--ntasks-per-node=4" in few.hint and "torchslurm run" in few.hint
    many = doctor.check_gpus(facts({**BATCH, "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_GPUS_ON_NODE": "2"},
                                   torch=GPU_TORCH))
    assert many.status == "warning" and "more ranks than GPUs" in many.detail
    assert doctor.check_gpus(facts({**BATCH, "SLURM_GPUS_ON_NODE": "2"}, torch=GPU_TORCH)).status == "ok"


@pytest.mark.parametrize("environ", [{**BATCH, "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_GPUS_ON_NODE": "4"},
                                     {**SRUN, "SLURM_GPUS_ON_NODE": "2", "CUDA_VISIBLE_DEVICES": "0,1"}],
                         ids=["batch shell", "srun task"])
def test_gpus_torch_cannot_see_are_found_wherever_the_doctor_runs(environ: dict[str, str]) -> None:
    """Slurm gave GPUs, but a CPU-only torch sees none: the batch shell must say so too, not only advise srun."""
    check = doctor.check_gpus(facts(environ, torch=CPU_TORCH))
    assert check.status == "warning" and "torch sees no CUDA device" in check.detail
    assert "CPU-only build" in check.detail and "CUDA build of torch" in check.hint
    both = doctor.check_gpus(facts({**BATCH, "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_GPUS_ON_NODE": "4"},
                                   torch=CPU_TORCH))  # and one task per node for 4 GPUs: both said
    assert both.detail.startswith("Slurm gave this task GPUs") and "3 GPU(s) stay idle" in both.detail
    assert "CUDA build of torch" in both.hint and "--ntasks-per-node=4" in both.hint


def test_gpus_cannot_be_counted_without_torch() -> None:
    check = doctor.check_gpus(facts(SRUN, torch=None))
    assert check.status == "warning" and "without torch" in check.detail


# ---- backend and torch -------------------------------------------------------------------------


def test_nccl_requested_without_cuda_fails() -> None:
    check = doctor.check_backend(facts(SRUN), "nccl")
    assert (check.status, check.value) == ("error", "nccl")
    assert_actionable(check, "--backend nccl", "torch.cuda.device_count()=0")
    assert "--backend gloo" in check.hint


def test_nccl_from_the_generated_job_script_on_a_cpu_node_fails_naming_the_variable() -> None:
    check = doctor.check_backend(facts({**SRUN, "TORCHSLURM_BACKEND": "nccl"}))
    assert check.status == "error"
    assert_actionable(check, "TORCHSLURM_BACKEND=nccl", "no CUDA device")
    assert doctor.check_backend(facts({**SRUN, "TORCHSLURM_BACKEND": "nccl"}), "gloo").status == "ok"
    bad = doctor.check_backend(facts({**SRUN, "TORCHSLURM_BACKEND": "mpi"}))
    assert bad.status == "error" and "TORCHSLURM_BACKEND=mpi" in bad.detail


def test_backend_defaults_follow_the_device() -> None:
    assert doctor.check_backend(facts(SRUN)).value == "gloo"
    assert doctor.check_backend(facts(SRUN, torch=GPU_TORCH)).value == "nccl"
    no_nccl = TorchFacts("2.13.0", "12.8", 4, None, True)
    assert doctor.check_backend(facts(SRUN, torch=no_nccl)).status == "error"


def test_torch_versions_and_missing_torch() -> None:
    ok = doctor.check_torch(facts(SRUN, torch=GPU_TORCH))
    assert ok.status == "ok" and "CUDA 12.8" in ok.detail and "NCCL 2.27.3" in ok.detail
    missing = doctor.check_torch(facts(SRUN, torch=None, torch_error="No module named 'torch'"))
    assert missing.status == "warning" and "not installed" in missing.detail and "pip install torch" in missing.hint


# ---- NCCL's environment -------------------------------------------------------------------------


def test_nccl_ib_disable_on_a_host_with_infiniband_warns() -> None:
    env = {**SRUN, "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "INFO"}
    warned = doctor.check_nccl_env(facts(env, infiniband=("mlx5_0",)))
    assert warned.status == "warning"
    assert_actionable(warned, "NCCL_IB_DISABLE=1", "mlx5_0")
    plain = doctor.check_nccl_env(facts(env))
    assert plain.status == "ok" and plain.detail == "set: NCCL_DEBUG=INFO, NCCL_IB_DISABLE=1."
    assert "NCCL_DEBUG=INFO" in doctor.check_nccl_env(facts(SRUN)).detail  # says how to debug a hang


# ---- Slurm commands -----------------------------------------------------------------------------


def test_slurm_commands() -> None:
    assert doctor.check_slurm_commands(facts({}, commands={})).status == "ok"
    assert doctor.check_slurm_commands(facts(SRUN)).value == "/usr/bin/srun"
    lost = doctor.check_slurm_commands(facts({**BATCH, "PATH": ""}, commands={}))
    assert lost.status == "error"
    assert_actionable(lost, "srun", "PATH=''")
    assert "--export=ALL" in lost.hint
    partial = doctor.check_slurm_commands(facts({"PATH": "/opt"}, commands={"sbatch": "/opt/sbatch"}))
    assert partial.status == "warning" and "srun" in partial.detail


UP = "Slurmctld(primary) at ctl1 is UP\nSlurmctld(backup) at ctl2 is DOWN\n"
DOWN = ("Slurmctld(primary) at ctl1 is DOWN\n*****************************************\n"
        "** RESTORE SLURMCTLD DAEMON TO SERVICE **\n*****************************************\n")
NO_CONFIG = ("scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
             "scontrol: fatal: Could not establish a configuration source\n")


def test_a_controller_that_answers_is_ok_and_named() -> None:
    check = doctor.check_controller(facts(SRUN, controller=(0, UP)))
    assert check.status == "ok" and check.value == "ctl1" and "answers at ctl1 (primary)" in check.detail


def test_a_controller_that_is_down_fails_inside_a_job_and_warns_outside() -> None:
    inside = doctor.check_controller(facts(SRUN, controller=(1, DOWN)))
    assert inside.status == "error"
    assert_actionable(inside, "ctl1 (primary) is DOWN", "requeue")
    assert "slurmctld runs on that host" in inside.hint
    outside = doctor.check_controller(facts({"PATH": "/usr/bin"}, controller=(1, DOWN)))
    assert outside.status == "warning" and "`torchslurm run` on this machine still works" in outside.detail


def test_a_client_without_a_cluster_configuration_says_which_file_to_fix() -> None:
    check = doctor.check_controller(facts({"PATH": "/usr/bin"}, controller=(1, NO_CONFIG)))
    assert check.status == "warning"
    assert_actionable(check, "Could not establish a configuration source", "exit 1")
    assert "SLURM_CONF" in check.hint


def test_the_controller_is_not_asked_without_scontrol_or_by_a_nodes_other_ranks() -> None:
    assert doctor.check_controller(facts({}, commands={})).detail == "not asked (scontrol is not on PATH)."
    assert "each node's first rank asks" in doctor.check_controller(facts(SRUN)).detail


# ---- the whole report ----------------------------------------------------------------------------


def test_report_of_a_healthy_srun_task_has_no_failure_and_runs_every_check_in_order() -> None:
    f = facts(SRUN)
    result = doctor.report(f, doctor.run_checks(f))
    assert not result.failed
    assert (result.host, result.rank, result.world_size, result.launcher) == ("node2", 2, 4, "srun")
    assert [c["name"] for c in result.to_json()["checks"]] == [
        "placement", "torch", "gpus", "cpus", "backend", "master_addr", "master_port", "nccl_socket_ifname",
        "gloo_socket_ifname", "nccl_env", "slurm_commands", "slurm_controller"]


def test_report_with_a_failure_is_failed() -> None:
    f = facts({**SRUN, "GLOO_SOCKET_IFNAME": "eth0"})
    result = doctor.report(f, doctor.run_checks(f))
    assert result.failed and result.to_json()["ok"] is False
    failed = [c for c in result.checks if c.status == "error"]
    assert [c.name for c in failed] == ["gloo_socket_ifname"] and failed[0].hint.startswith("unset GLOO_SOCKET_IFNAME")


def test_missing_ranks_are_those_of_the_largest_world_that_did_not_report() -> None:
    def rank(r: int | None, world: int | None) -> doctor.Report:
        return doctor.Report("n1", r, world, "srun", ())

    assert doctor.missing_ranks([rank(0, 4), rank(2, 4)]) == [1, 3]
    assert doctor.missing_ranks([rank(1, 2), rank(0, 2)]) == []
    assert doctor.missing_ranks([]) == []
    assert doctor.missing_ranks([rank(None, None), rank(None, None)]) == []  # placement unknown everywhere


def test_cpus_an_srun_task_on_fewer_cpus_than_asked_is_found_in_the_task_and_the_batch_shell() -> None:
    lost = doctor.check_cpus(facts({**SRUN, "SLURM_CPUS_PER_TASK": "8"}, usable_cpus=1))
    assert lost.status == "warning"
    assert_actionable(lost, "SLURM_CPUS_PER_TASK=8", "on 1 CPU(s)")
    assert "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK" in lost.hint
    shell = doctor.check_cpus(facts({**BATCH, "SLURM_CPUS_PER_TASK": "8"}))
    assert shell.status == "warning" and "SRUN_CPUS_PER_TASK is not set" in shell.detail
    assert doctor.check_cpus(facts({**SRUN, "SLURM_CPUS_PER_TASK": "8"}, usable_cpus=8)).status == "ok"
    assert doctor.check_cpus(facts({**BATCH, "SLURM_CPUS_PER_TASK": "8", "SRUN_CPUS_PER_TASK": "8"})).status == "ok"


def test_cpus_more_ranks_than_the_nodes_cpus_is_a_warning() -> None:
    crowded = doctor.check_cpus(facts({**SRUN, "SLURM_CPUS_ON_NODE": "1"}, usable_cpus=4))
    assert crowded.status == "warning" and "2 ranks on this node but SLURM_CPUS_ON_NODE=1" in crowded.detail
    assert doctor.check_cpus(facts({}, usable_cpus=4)).status == "ok"


def test_the_nodes_a_job_excludes_are_shown_and_not_asked_outside_a_job() -> None:
    f = facts(SRUN, excluded_nodes="node[3-4]")
    [check] = doctor.check_excluded_nodes(f)
    assert (check.status, check.value) == ("info", "node[3-4]")
    assert check.detail.startswith("job 42 excludes node[3-4] (ExcNodeList): its --exclude, or nodes a node-level "
                                   "failure of an earlier attempt took out")
    assert doctor.run_checks(f)[-1] == check
    assert doctor.check_excluded_nodes(facts(SRUN, excluded_nodes="")) == [
        doctor.Check("excluded_nodes", "ok", "job 42 excludes no node.")]
    assert doctor.check_excluded_nodes(facts(SRUN)) == []  # not asked: no line
