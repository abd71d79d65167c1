"""The doctor's checks on plain dicts and recorded facts, probe.gather on this machine, the CLI rendering,
the doctor without torch, and the pure parts of torchslurm.doctor.bench (sizes, nccl-tests formulas, table)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from torchslurm.cli.doctor import render
from torchslurm.doctor import bench, probe
from torchslurm.doctor import checks as doctor
from torchslurm.doctor.checks import Check, Facts, TorchFacts
from torchslurm.errors import ConfigError, EnvError
from torchslurm.runtime.netif import IfAddr

SLURM_ENV = Path(__file__).parents[2] / "fixtures" / "slurm_env"

CPU_TORCH = TorchFacts(version="2.13.0+cpu", cuda=None, cuda_device_count=0, nccl=None, gloo=True)
GPU_TORCH = TorchFacts(version="2.13.0", cuda="12.8", cuda_device_count=4, nccl="2.27.3", gloo=True)
NODE1 = (IfAddr("lo", "127.0.0.1"), IfAddr("eth0", "198.18.0.11"))
NODE2 = (IfAddr("lo", "127.0.0.1"), IfAddr("ens1f0", "198.18.0.12"))
ALL_COMMANDS = {name: f"/usr/bin/{name}" for name in doctor.SLURM_COMMANDS}

# An srun task of a 2-node x 2-task step, as slurmd 22.05 sets it (subset).
SRUN = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "node[1-2]", "PATH": "/usr/bin"}
BATCH = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "4", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
         "SLURM_JOB_NODELIST": "node[1-2]", "PATH": "/usr/bin"}

WithoutTorch = Callable[..., subprocess.CompletedProcess[str]]


def facts(environ: dict[str, str], **kw: Any) -> Facts:
    """node2 of the sandbox reaching node1 (the master) over ens1f0, unless overridden."""
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


# ---- placement ---------------------------------------------------------------------------------


def test_srun_task_placement_is_ok_and_names_the_launcher() -> None:
    check = doctor.check_placement(facts(SRUN))
    assert (check.status, check.value) == ("ok", "srun")
    assert "srun task 2 of 4" in check.detail


def test_python_without_srun_in_a_multi_task_allocation_warns_one_gpu_of_many() -> None:
    check = doctor.check_placement(facts(BATCH))
    assert (check.status, check.value) == ("warn", "batch")
    assert_actionable(check, "SLURM_NTASKS=4", "not started by srun")
    assert "srun python train.py" in check.hint and "srun torchslurm doctor" in check.hint


def test_rank_exported_in_the_job_script_fails_placement_and_skips_what_depends_on_it() -> None:
    env = {**SRUN, "RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "node1", "MASTER_PORT": "1234"}
    checks = by_name(doctor.run_checks(facts(env)))
    assert checks["placement"].status == "fail"
    assert_actionable(checks["placement"], "RANK=0", "SLURM_PROCID=2")
    assert "export RANK" in checks["placement"].hint
    assert {checks[n].status for n in ("gpus", "master_addr", "master_port", "gloo_socket_ifname")} == {"warn"}
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
    assert (check.status, check.value) == ("warn", "cuda:0")
    assert_actionable(check, "CUDA_VISIBLE_DEVICES='0,1,2,3'", "3 GPU(s) idle")
    assert "--ntasks-per-node=4" in check.hint


def test_more_ranks_than_gpus_fails_with_the_runtimes_message() -> None:
    env = {**SRUN, "CUDA_VISIBLE_DEVICES": "0"}
    check = doctor.check_gpus(facts(env, torch=TorchFacts("2.13.0", "12.8", 1, "2.27.3", True)))
    assert check.status == "fail"
    assert_actionable(check, "CUDA_VISIBLE_DEVICES='0'", "2 ranks share")
    assert "--gpus-per-node=2" in check.hint


def test_slurm_gpus_but_cpu_only_torch_warns() -> None:
    env = {**SRUN, "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_GPUS_ON_NODE": "2", "SLURM_STEP_GPUS": "0,1"}
    check = doctor.check_gpus(facts(env))
    assert check.status == "warn"
    assert_actionable(check, "SLURM_GPUS_ON_NODE=2", "CPU-only build")


def test_batch_shell_compares_tasks_per_node_with_gpus_per_node() -> None:
    few = doctor.check_gpus(facts({**BATCH, "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_GPUS_ON_NODE": "4"}))
    assert few.status == "warn"
    assert_actionable(few, "SLURM_GPUS_ON_NODE=4", "SLURM_TASKS_PER_NODE=1(x2)", "3 GPU(s) stay idle")
    assert "--ntasks-per-node=4" in few.hint and "torchslurm run" in few.hint
    many = doctor.check_gpus(facts({**BATCH, "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_GPUS_ON_NODE": "2"}))
    assert many.status == "warn" and "more ranks than GPUs" in many.detail
    assert doctor.check_gpus(facts({**BATCH, "SLURM_GPUS_ON_NODE": "2"})).status == "ok"


def test_gpus_cannot_be_counted_without_torch() -> None:
    check = doctor.check_gpus(facts(SRUN, torch=None))
    assert check.status == "warn" and "without torch" in check.detail


# ---- backend and torch -------------------------------------------------------------------------


def test_nccl_requested_without_cuda_fails() -> None:
    check = doctor.check_backend(facts(SRUN), "nccl")
    assert (check.status, check.value) == ("fail", "nccl")
    assert_actionable(check, "--backend nccl", "torch.cuda.device_count()=0")
    assert "--backend gloo" in check.hint


def test_nccl_from_the_generated_job_script_on_a_cpu_node_fails_naming_the_variable() -> None:
    check = doctor.check_backend(facts({**SRUN, "TORCHSLURM_BACKEND": "nccl"}))
    assert check.status == "fail"
    assert_actionable(check, "TORCHSLURM_BACKEND=nccl", "no CUDA device")
    assert doctor.check_backend(facts({**SRUN, "TORCHSLURM_BACKEND": "nccl"}), "gloo").status == "ok"
    bad = doctor.check_backend(facts({**SRUN, "TORCHSLURM_BACKEND": "mpi"}))
    assert bad.status == "fail" and "TORCHSLURM_BACKEND=mpi" in bad.detail


def test_backend_defaults_follow_the_device() -> None:
    assert doctor.check_backend(facts(SRUN)).value == "gloo"
    assert doctor.check_backend(facts(SRUN, torch=GPU_TORCH)).value == "nccl"
    no_nccl = TorchFacts("2.13.0", "12.8", 4, None, True)
    assert doctor.check_backend(facts(SRUN, torch=no_nccl)).status == "fail"


def test_torch_versions_and_missing_torch() -> None:
    ok = doctor.check_torch(facts(SRUN, torch=GPU_TORCH))
    assert ok.status == "ok" and "CUDA 12.8" in ok.detail and "NCCL 2.27.3" in ok.detail
    missing = doctor.check_torch(facts(SRUN, torch=None, torch_error="No module named 'torch'"))
    assert missing.status == "warn" and "not installed" in missing.detail and "pip install torch" in missing.hint


# ---- master address and port -------------------------------------------------------------------


def test_master_resolving_to_loopback_on_the_master_node_warns_pitfall_2() -> None:
    env = {**SRUN, "SLURM_PROCID": "0", "SLURM_NODEID": "0"}
    check = doctor.check_master_addr(facts(env, hostname="node1", interfaces=NODE1, master_ips=("127.0.1.1",),
                                           source="127.0.0.1"))
    assert check.status == "warn"
    assert_actionable(check, "MASTER_ADDR (unset; torchslurm uses node1) resolves to 127.0.1.1")
    assert "/etc/hosts" in check.hint


def test_master_resolving_to_loopback_on_another_node_fails() -> None:
    check = doctor.check_master_addr(facts(SRUN, master_ips=("127.0.1.1",), source="127.0.0.1"))
    assert check.status == "fail"
    assert_actionable(check, "MASTER_ADDR (unset; torchslurm uses node1) resolves to 127.0.1.1", "2 nodes")


def test_localhost_master_in_a_multi_node_step_fails() -> None:
    check = doctor.check_master_addr(facts({**SRUN, "MASTER_ADDR": "localhost"}, master_ips=("127.0.0.1",),
                                           source="127.0.0.1"))
    assert check.status == "fail" and "MASTER_ADDR=localhost" in check.detail


def test_unresolvable_and_unroutable_master_fail() -> None:
    error = EnvError("MASTER_ADDR='node1' does not resolve on host node2.", "use a host name of this job's node list")
    bad = doctor.check_master_addr(facts(SRUN, master_ips=(), resolve_error=error))
    assert (bad.status, bad.detail, bad.hint) == ("fail", error.message, error.hint)
    unroutable = doctor.check_master_addr(facts(SRUN, source=None))
    assert unroutable.status == "fail" and "no route" in unroutable.detail


def test_batch_shell_checks_the_master_its_ranks_will_use() -> None:
    check = doctor.check_master_addr(facts(BATCH, hostname="node1", interfaces=NODE1, source="198.18.0.11"))
    assert (check.status, check.value) == ("ok", "node1")
    assert check.detail.startswith("MASTER_ADDR (unset; torchslurm uses node1) resolves to"), check.detail


def test_hard_coded_master_addr_that_is_not_rank_0s_node_fails() -> None:
    env = {**SRUN, "MASTER_ADDR": "192.168.20.15"}
    check = doctor.check_master_addr(facts(env, master_ips=("192.168.20.15",), first_node_ips=("198.18.0.11",)))
    assert check.status == "fail"
    assert_actionable(check, "MASTER_ADDR=192.168.20.15", "rank 0 runs on node1")
    assert "remove MASTER_ADDR" in check.hint
    same_node = facts({**SRUN, "MASTER_ADDR": "198.18.0.11"}, first_node_ips=("198.18.0.11",))
    assert doctor.check_master_addr(same_node).status == "ok"


def test_fixed_master_port_inside_slurm_warns_pitfall_4() -> None:
    check = doctor.check_master_port(facts({**SRUN, "MASTER_PORT": "29500"}))
    assert (check.status, check.value) == ("warn", "29500")
    assert_actionable(check, "MASTER_PORT=29500", "job 42")
    assert "unset MASTER_PORT" in check.hint


def test_master_port_ok_when_derived_set_by_torchrun_or_outside_slurm() -> None:
    assert doctor.check_master_port(facts(SRUN)).status == "ok"
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                "MASTER_ADDR": "node1", "MASTER_PORT": "29500", "SLURM_JOB_ID": "42"}
    assert doctor.check_master_port(facts(torchrun)).status == "ok"
    assert doctor.check_master_port(facts({"MASTER_PORT": "29500"})).status == "ok"


# ---- network interfaces -------------------------------------------------------------------------


def test_unset_socket_ifnames_report_this_nodes_own_nic() -> None:
    checks = by_name(doctor.check_interfaces(facts(SRUN)))
    assert (checks["gloo_socket_ifname"].status, checks["gloo_socket_ifname"].value) == ("ok", "ens1f0")
    assert checks["nccl_socket_ifname"].value == "ens1f0"
    assert "198.18.0.12 on ens1f0" in checks["gloo_socket_ifname"].detail


def test_one_gloo_socket_ifname_for_all_nodes_fails_where_it_does_not_exist() -> None:
    checks = by_name(doctor.check_interfaces(facts({**SRUN, "GLOO_SOCKET_IFNAME": "eth0"})))
    gloo = checks["gloo_socket_ifname"]
    assert gloo.status == "fail"
    assert_actionable(gloo, "GLOO_SOCKET_IFNAME=eth0", "node2", "ens1f0")
    assert "unset GLOO_SOCKET_IFNAME" in gloo.hint and "ens1f0 here" in gloo.hint
    on_node1 = doctor.check_interfaces(facts({**SRUN, "SLURM_NODEID": "0", "SLURM_PROCID": "0",
                                              "GLOO_SOCKET_IFNAME": "eth0"}, hostname="node1", interfaces=NODE1,
                                             source="198.18.0.11", own_addresses=("198.18.0.11",)))
    assert by_name(on_node1)["gloo_socket_ifname"].status == "ok"


def test_nccl_socket_ifname_prefix_exact_and_exclusion_syntax() -> None:
    def nccl(value: str, torch: TorchFacts = GPU_TORCH) -> Check:
        env = {**SRUN, "NCCL_SOCKET_IFNAME": value, "CUDA_VISIBLE_DEVICES": "0,1"}
        return by_name(doctor.check_interfaces(facts(env, torch=torch)))["nccl_socket_ifname"]

    assert nccl("ens").status == "ok"            # prefix match, NCCL's default
    assert nccl("=ens1f0").status == "ok"
    assert nccl("=ens").status == "fail"         # '=' means exact
    assert nccl("^docker,lo").status == "ok"
    assert nccl("eth").status == "fail" and "NCCL_SOCKET_IFNAME=eth" in nccl("eth").detail
    assert nccl("eth", CPU_TORCH).status == "warn"  # Gloo job: NCCL's variable does not matter


def test_loopback_socket_ifname_in_a_multi_node_step_fails() -> None:
    gloo = by_name(doctor.check_interfaces(facts({**SRUN, "GLOO_SOCKET_IFNAME": "lo"})))["gloo_socket_ifname"]
    assert gloo.status == "fail" and "loopback" in gloo.detail and gloo.hint


def test_socket_ifname_that_is_not_the_route_to_the_master_warns() -> None:
    table = (*NODE2, IfAddr("docker0", "172.17.0.1"))
    gloo = by_name(doctor.check_interfaces(facts({**SRUN, "GLOO_SOCKET_IFNAME": "docker0"}, interfaces=table)))
    assert gloo["gloo_socket_ifname"].status == "warn"
    assert "GLOO_SOCKET_IFNAME=ens1f0" in gloo["gloo_socket_ifname"].hint


def test_no_interface_choice_fails_with_the_runtimes_hint() -> None:
    table = (*NODE1, IfAddr("eth1", "10.0.0.1"))
    env = {**SRUN, "SLURM_NODEID": "0", "SLURM_PROCID": "0"}
    checks = by_name(doctor.check_interfaces(facts(env, hostname="node1", interfaces=table,
                                                   master_ips=("127.0.1.1",), source="127.0.0.1", own_addresses=())))
    gloo = checks["gloo_socket_ifname"]
    assert gloo.status == "fail" and "ambiguous" in gloo.detail and "HINT" not in gloo.detail
    assert "/etc/hosts" in gloo.hint


def test_nccl_ib_disable_on_a_host_with_infiniband_warns() -> None:
    env = {**SRUN, "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "INFO"}
    warned = doctor.check_nccl_env(facts(env, infiniband=("mlx5_0",)))
    assert warned.status == "warn"
    assert_actionable(warned, "NCCL_IB_DISABLE=1", "mlx5_0")
    plain = doctor.check_nccl_env(facts(env))
    assert plain.status == "ok" and plain.detail == "set: NCCL_DEBUG=INFO, NCCL_IB_DISABLE=1."
    assert "NCCL_DEBUG=INFO" in doctor.check_nccl_env(facts(SRUN)).detail  # says how to debug a hang


# ---- Slurm commands -----------------------------------------------------------------------------


def test_slurm_commands() -> None:
    assert doctor.check_slurm_commands(facts({}, commands={})).status == "ok"
    assert doctor.check_slurm_commands(facts(SRUN)).value == "/usr/bin/srun"
    lost = doctor.check_slurm_commands(facts({**BATCH, "PATH": ""}, commands={}))
    assert lost.status == "fail"
    assert_actionable(lost, "srun", "PATH=''")
    assert "--export=ALL" in lost.hint
    partial = doctor.check_slurm_commands(facts({"PATH": "/opt"}, commands={"sbatch": "/opt/sbatch"}))
    assert partial.status == "warn" and "srun" in partial.detail


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
    assert inside.status == "fail"
    assert_actionable(inside, "ctl1 (primary) is DOWN", "requeue")
    assert "slurmctld runs on that host" in inside.hint
    outside = doctor.check_controller(facts({"PATH": "/usr/bin"}, controller=(1, DOWN)))
    assert outside.status == "warn" and "`torchslurm run` on this machine still works" in outside.detail


def test_a_client_without_a_cluster_configuration_says_which_file_to_fix() -> None:
    check = doctor.check_controller(facts({"PATH": "/usr/bin"}, controller=(1, NO_CONFIG)))
    assert check.status == "warn"
    assert_actionable(check, "Could not establish a configuration source", "exit 1")
    assert "SLURM_CONF" in check.hint


def test_the_controller_is_not_asked_without_scontrol_or_by_a_nodes_other_ranks() -> None:
    assert doctor.check_controller(facts({}, commands={})).detail == "not asked (scontrol is not on PATH)."
    assert "each node's first rank asks" in doctor.check_controller(facts(SRUN)).detail


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="Slurm's client (scontrol) is not installed")
def test_the_real_scontrol_ping_of_a_controller_nobody_runs_is_reported_down(tmp_path: Path) -> None:
    with socket.socket() as closed:  # bound, never listening: slurmctld's port refuses connections
        closed.bind(("127.0.0.1", 0))
        conf = tmp_path / "slurm.conf"
        conf.write_text(f"ClusterName=pingtest\nSlurmctldHost=localhost(127.0.0.1)\n"
                        f"SlurmctldPort={closed.getsockname()[1]}\nNodeName=n1\n")
        found = probe.gather({"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"})
    check = doctor.check_controller(found)
    assert found.controller is not None and found.controller[0] != 0, found.controller
    assert check.status == "warn" and "(primary) is DOWN" in check.detail, check


# ---- the whole report ----------------------------------------------------------------------------


def test_report_of_a_healthy_srun_task_has_no_failure_and_renders_every_check() -> None:
    f = facts(SRUN)
    result = doctor.report(f, doctor.run_checks(f))
    assert not result.failed
    assert (result.host, result.rank, result.world_size, result.launcher) == ("node2", 2, 4, "srun")
    text = render(result)
    assert all(line.startswith("node2/2: ") for line in text.splitlines())  # several ranks share the output
    assert [c["name"] for c in result.to_json()["checks"]] == [
        "placement", "torch", "gpus", "backend", "master_addr", "master_port", "nccl_socket_ifname",
        "gloo_socket_ifname", "nccl_env", "slurm_commands", "slurm_controller"]


def test_report_with_a_failure_is_failed_and_shows_the_hint() -> None:
    f = facts({**SRUN, "GLOO_SOCKET_IFNAME": "eth0"})
    result = doctor.report(f, doctor.run_checks(f))
    assert result.failed and result.to_json()["ok"] is False
    text = render(result)
    assert "FAIL  gloo_socket_ifname" in text and "HINT: unset GLOO_SOCKET_IFNAME" in text
    assert text.splitlines()[-1].endswith("1 failure(s)")


def test_a_report_read_back_from_its_json_line_is_the_same_report() -> None:
    f = facts({**SRUN, "GLOO_SOCKET_IFNAME": "eth0"})
    result = doctor.report(f, doctor.run_checks(f))
    again = doctor.Report.from_json(json.loads(json.dumps(result.to_json())))
    assert again == result and again.failed
    for not_a_report in ({"host": "n1"}, {"checks": 3}, [1, 2]):
        with pytest.raises((KeyError, TypeError)):
            doctor.Report.from_json(not_a_report)  # type: ignore[arg-type]


def test_rank_reports_survive_interleaving_as_parts_shorter_than_srun_chunks() -> None:
    from torchslurm.cli.doctor import report_parts, reports_from_parts

    results = []
    for env in ({**SRUN, "SLURM_PROCID": "0"}, {**SRUN, "GLOO_SOCKET_IFNAME": "eth0"}):
        f = facts(env)
        results.append(doctor.report(f, doctor.run_checks(f)))
    first, second = (report_parts(r, f"node2:{pid}") for pid, r in enumerate(results))
    assert len(first) > 1 and all(len(line.encode()) < 1024 and line.endswith("\n") for line in first + second)
    interleaved = [line for pair in zip(reversed(first), second, strict=False) for line in pair]
    interleaved += first[: len(first) - len(second)] if len(first) > len(second) else second[len(first):]
    assert reports_from_parts(interleaved) == (sorted(results, key=lambda r: r.rank or 0), 0)
    assert reports_from_parts(first[1:] + second) == ([results[1]], 1)  # an incomplete report is counted
    labelled = [f"{n}: {line}" for n, line in enumerate(second)]  # srun --label (SLURM_LABELIO=1)
    assert reports_from_parts(labelled) == ([results[1]], 0)


def test_parts_of_processes_that_claim_the_same_rank_stay_apart_and_garbage_is_counted() -> None:
    from torchslurm.cli.doctor import report_parts, reports_from_parts

    f = facts({**SRUN, "RANK": "0"})  # an exported RANK: every task claims rank 0 (or placement fails)
    result = doctor.report(f, doctor.run_checks(f))
    a, b = report_parts(result, "node1:11"), report_parts(result, "node2:22")
    assert reports_from_parts([*a, *b]) == ([result, result], 0)
    mangled = ["@torchslurm-doctor-part node3:33 0 1", "@torchslurm-doctor-part node3:33 x 2 {",
               "@torchslurm-doctor-part node4:44 5 1 {}", "@torchslurm-doctor-part node5:55 0 1 {not json"]
    assert reports_from_parts([*a, *mangled]) == ([result], 3)  # node3 (no count), node4 (no part 0), node5


def test_missing_ranks_are_those_of_the_largest_world_that_did_not_report() -> None:
    def rank(r: int | None, world: int | None) -> doctor.Report:
        return doctor.Report("n1", r, world, "srun", ())

    assert doctor.missing_ranks([rank(0, 4), rank(2, 4)]) == [1, 3]
    assert doctor.missing_ranks([rank(1, 2), rank(0, 2)]) == []
    assert doctor.missing_ranks([]) == []
    assert doctor.missing_ranks([rank(None, None), rank(None, None)]) == []  # placement unknown everywhere


def test_gather_records_this_machine() -> None:
    f = probe.gather({"PATH": "/usr/bin:/bin", "MASTER_ADDR": "127.0.0.1"}, which=lambda name: None)
    assert any(entry.loopback for entry in f.interfaces)
    assert f.master_ips == ("127.0.0.1",) and f.source == "127.0.0.1"
    assert f.torch is not None and f.torch.gloo
    assert not doctor.report(f, doctor.run_checks(f)).failed


def test_bench_validates_and_plans_without_torch(without_torch: WithoutTorch) -> None:
    result = without_torch("bench", "--nproc", "2", "--sizes", "1K,1M", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("local: ") and "-m torchslurm.cli.bench --sizes 1K,1M" in result.stdout


def test_doctor_runs_and_says_so_without_torch(without_torch: WithoutTorch) -> None:
    result = without_torch("doctor", "--json")
    assert result.returncode == 0, result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["torch"]["status"] == "warn" and "not installed" in checks["torch"]["detail"]
    assert checks["placement"]["status"] == "ok"


# ---- bench: the pure parts ------------------------------------------------------------------------


def test_parse_and_format_sizes() -> None:
    assert bench.parse_sizes("1K, 64KiB,1M,2g,100,8B") == (1024, 65536, 1 << 20, 2 << 30, 100, 8)
    assert [bench.format_size(s) for s in (1024, 1536, 1 << 20, 3 << 30)] == ["1K", "1536", "1M", "3G"]
    for bad in ("", "1X", "-1K", "0"):
        with pytest.raises(ConfigError, match="HINT: "):
            bench.parse_sizes(bad)


def test_nccl_tests_bus_bandwidth_factors() -> None:
    assert bench.bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bench.bus_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert bench.bus_factor("broadcast", 16) == 1.0
    assert bench.bus_factor("all_reduce", 1) == 0.0
    algbw, busbw = bench.bandwidth("all_reduce", 1_000_000_000, 0.5, 4)
    assert (algbw, busbw) == pytest.approx((2.0, 3.0))
    with pytest.raises(ConfigError, match="op='reduce'"):
        bench.bus_factor("reduce", 2)


def test_all_gather_buffers_hold_one_share_of_the_size() -> None:
    assert bench.elements_per_rank("all_gather", 1 << 20, 4) == (1 << 20) // 16
    assert bench.elements_per_rank("all_reduce", 1 << 20, 4) == (1 << 20) // 4
    assert bench.elements_per_rank("broadcast", 2, 4) == 1


def test_bench_config_validation_names_the_flag() -> None:
    assert bench.BenchConfig().sizes == bench.parse_sizes(bench.DEFAULT_SIZES)
    for kw, flag in (({"ops": ("all_to_all",)}, "--ops"), ({"iters": 0}, "--iters=0"),
                     ({"warmup": -1}, "--warmup=-1"), ({"backend": "mpi"}, "--backend='mpi'")):
        with pytest.raises(ConfigError, match=f"{flag}.*HINT: "):
            bench.BenchConfig(**kw)


def test_table_has_a_row_per_result_and_each_ops_peak() -> None:
    rows = [bench.BenchResult("all_reduce", 1024, 2, 5, 10.0, 0.1, 0.1),
            bench.BenchResult("all_reduce", 1 << 20, 2, 5, 100.0, 10.5, 10.5),
            bench.BenchResult("broadcast", 1024, 2, 5, 5.0, 0.2, 0.2)]
    text = bench.render_table(rows, header="hdr")
    lines = text.splitlines()
    assert lines[0] == "hdr" and len(lines) == 2 + 3 + 2
    assert "peak all_reduce busbw: 10.5 GB/s at 1M" in text
    assert "peak broadcast busbw: 0.2 GB/s at 1K" in text


def test_master_port_that_torchslurm_run_derived_for_this_step_is_ok() -> None:
    from torchslurm.runtime.distenv import derived_port

    port = str(derived_port("42", "0"))
    check = doctor.check_master_port(facts({**SRUN, "MASTER_PORT": port}))
    assert (check.status, check.value) == ("ok", port)
