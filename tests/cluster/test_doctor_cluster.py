"""`torchslurm doctor` and `torchslurm bench` on the sandbox cluster: srun tasks on nodes whose NICs
have different names (node1 eth0, node2 ens1f0), a GLOO_SOCKET_IFNAME that exists on one node only,
the batch shell's view and `doctor --ranks` from it, fake-GPU jobs, and bench across two nodes."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from torchslurm.sandbox.config import nic_name

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.cluster

TWO_NODES = ["srun", "--nodes=2", "--ntasks-per-node=1", "--nodelist=node1,node2", "--time=2"]


def doctor_srun(cluster: Cluster, *args: str, **env: str) -> tuple[int, list[dict[str, Any]], str]:
    """srun the doctor as one task on node1 and one on node2; (exit code, reports by rank, output).

    One output file per task: srun forwards task output in chunks of about 1 KiB, so two tasks'
    longer JSON lines interleave on a shared stdout (seen here).
    """
    result = cluster.run([*TWO_NODES, f"--output={cluster.job_dir}/doctor-%t.json", cluster.python, "-m",
                          "torchslurm", "doctor", "--json", *args], timeout_s=120, cwd=cluster.job_dir,
                         env={**cluster.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", **env})
    texts = [p.read_text() for p in sorted(cluster.job_dir.glob("doctor-*.json"))]
    found = sorted((json.loads(line) for text in texts for line in text.splitlines() if line.startswith("{")),
                   key=lambda r: r["rank"])
    return result.returncode, found, result.stdout + result.stderr + "".join(texts)


def lines_of(output: str, host_rank: str) -> dict[str, str]:
    """The human report of one rank (lines prefixed 'node1/0: '), check name → its line."""
    found = {}
    for line in output.splitlines():
        if line.startswith(f"{host_rank}: ") and len(line.split()) > 3 and line.split()[1] in ("ok", "WARN", "FAIL"):
            found[line.split()[2]] = line
    return found


def checks(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in report["checks"]}


def node_index(host: str) -> int:
    return int(host.removeprefix("node"))


def test_doctor_as_srun_tasks_reports_each_nodes_own_nic_and_connects(cluster: Cluster) -> None:
    code, found, output = doctor_srun(cluster, "--connect", "--timeout", "60")
    assert code == 0, output
    assert [(r["host"], r["rank"], r["launcher"]) for r in found] == [("node1", 0, "srun"), ("node2", 1, "srun")]
    for r in found:
        by_name = checks(r)
        assert r["ok"] and not [c for c in r["checks"] if c["status"] == "fail"], r
        assert by_name["gloo_socket_ifname"]["value"] == nic_name(node_index(r["host"])), r
        assert by_name["master_addr"]["value"] == "node1"
        assert by_name["connect"]["status"] == "ok" and "summed to 2" in by_name["connect"]["detail"], r
        controller = by_name["slurm_controller"]  # each node's first rank pings the sandbox's slurmctld
        assert controller["status"] == "ok" and "answers at" in controller["detail"], controller


def test_one_gloo_socket_ifname_for_every_node_is_flagged_where_that_nic_does_not_exist(cluster: Cluster) -> None:
    code, found, output = doctor_srun(cluster, GLOO_SOCKET_IFNAME="eth0")
    assert code != 0, output
    node1, node2 = (checks(r)["gloo_socket_ifname"] for r in found)
    assert [r["host"] for r in found] == ["node1", "node2"]
    assert node1["status"] == "ok", node1  # node1's NIC is eth0
    assert node2["status"] == "fail", node2
    assert "GLOO_SOCKET_IFNAME=eth0" in node2["detail"] and "node2" in node2["detail"]
    assert "ens1f0" in node2["detail"] and "unset GLOO_SOCKET_IFNAME" in node2["hint"]
    assert [r["ok"] for r in found] == [True, False]


def test_doctor_in_a_batch_shell_warns_without_srun_and_ranks_checks_every_node(cluster: Cluster) -> None:
    script = f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1
export TORCH_CPP_LOG_LEVEL=ERROR
{cluster.python} -m torchslurm doctor --json
{cluster.python} -m torchslurm doctor --ranks --connect --timeout 60
"""
    job = cluster.sbatch(script)
    state = cluster.wait(job, timeout_s=180)
    out = cluster.output(job)
    assert state == "COMPLETED", out[-4000:]
    shell = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert (shell["launcher"], checks(shell)["placement"]["status"]) == ("batch", "warn"), shell
    assert "SLURM_NNODES=2" in checks(shell)["placement"]["detail"]
    # `--ranks` from the batch shell: srun across both nodes, one rank each, each checks its own node.
    hosts = {line.split(":", 1)[0] for line in out.splitlines() if line.startswith("node")}
    assert hosts == {"node1/0", "node2/1"}, out[-4000:]
    for host_rank in hosts:
        found = lines_of(out, host_rank)
        nic = nic_name(node_index(host_rank.split("/")[0]))
        # `torchslurm run` under srun sets each rank's *_SOCKET_IFNAME to its own node's NIC.
        assert f"GLOO_SOCKET_IFNAME={nic} is set; {nic} is UP on" in found["gloo_socket_ifname"], found
        assert "summed to 2" in found["connect"] and " ok " in found["connect"], found
        assert not [line for line in found.values() if " FAIL " in line], found


def test_doctor_ranks_where_one_node_fails_still_reports_every_node_and_exits_1(cluster: Cluster) -> None:
    """srun --kill-on-bad-exit must not kill node1's rank before it reports: the ranks exit 0 and
    the batch shell's doctor decides; long JSON reports must not interleave."""
    script = f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=2
export TORCH_CPP_LOG_LEVEL=ERROR GLOO_SOCKET_IFNAME=eth0
{cluster.python} -m torchslurm doctor --ranks --json
echo "doctor exit code: $?"
"""
    job = cluster.sbatch(script)
    state = cluster.wait(job, timeout_s=180)
    out = cluster.output(job)
    assert state == "COMPLETED", out[-4000:]
    found = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["rank"], r["host"], r["ok"]) for r in found] == [
        (0, "node1", True), (1, "node1", True), (2, "node2", False), (3, "node2", False)], out[-4000:]
    assert "GLOO_SOCKET_IFNAME=eth0" in checks(found[2])["gloo_socket_ifname"]["detail"]
    assert "doctor exit code: 1" in out and "the doctor found a failure in at least one rank" in out


def test_bench_across_two_nodes(cluster: Cluster) -> None:
    result = cluster.run([*TWO_NODES, cluster.python, "-m", "torchslurm", "bench", "--sizes", "1K,256K",
                          "--iters", "3", "--warmup", "1"], timeout_s=120, cwd=cluster.job_dir,
                         env={**cluster.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("torchslurm bench: 2 rank(s) on 2 node(s), gloo on cpu") == 1
    rows = [line.split() for line in result.stdout.splitlines()
            if line.startswith(("all_reduce", "all_gather", "broadcast"))]
    assert len(rows) == 6 and all(float(r[5]) > 0 for r in rows), result.stdout


def test_gpu_job_with_one_task_per_node_warns_idle_gpus_and_a_cpu_only_torch(cluster: Cluster) -> None:
    """The sandbox's fake GPUs: Slurm sets the real GPU variables; torch here is a CPU build."""
    script = f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=4
export TORCH_CPP_LOG_LEVEL=ERROR
{cluster.python} -m torchslurm doctor --json
srun --output={cluster.job_dir}/task-%t.json {cluster.python} -m torchslurm doctor --json
"""
    job = cluster.sbatch(script)
    state = cluster.wait(job, timeout_s=180)
    out = cluster.output(job)
    assert state == "COMPLETED", out[-4000:]
    shell = checks(json.loads(next(line for line in out.splitlines() if line.startswith("{"))))["gpus"]
    assert shell["status"] == "warn", shell
    assert shell["detail"].startswith("Slurm gave this task GPUs") and "CPU-only build" in shell["detail"]
    assert "SLURM_GPUS_ON_NODE=4 but SLURM_TASKS_PER_NODE=1(x2)" in shell["detail"]
    assert "3 GPU(s) stay idle" in shell["detail"] and "--ntasks-per-node=4" in shell["hint"]
    tasks = [json.loads(p.read_text()) for p in sorted(cluster.job_dir.glob("task-*.json"))]
    assert len(tasks) == 2
    for task in tasks:
        gpus = checks(task)["gpus"]
        assert gpus["status"] == "warn" and "SLURM_GPUS_ON_NODE=4" in gpus["detail"], gpus
        assert "CPU-only build" in gpus["detail"]
