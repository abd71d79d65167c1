"""The sandbox cluster itself: nodes, namespaces, fake GPUs, idempotent up/down, the CLI."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from torchslurm.sandbox import cluster as sandbox

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.cluster


def cli(*args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "torchslurm", *args]
    if user:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_status_reports_every_daemon_and_node(cluster: Cluster) -> None:
    st = sandbox.status(cluster.lab_dir)
    assert st.healthy, st
    assert set(st.node_states) == set(cluster.nodes)
    result = cli("sandbox", "status", "--lab-dir", str(cluster.lab_dir))
    assert result.returncode == 0, result.stderr
    assert f"sandbox: up in {cluster.lab_dir}" in result.stdout
    assert "slurmd@node2" in result.stdout


def test_up_again_is_harmless(cluster: Cluster) -> None:
    before = sandbox.status(cluster.lab_dir).daemons
    again = sandbox.up(cluster.config)
    assert not again.started
    assert again.daemons == before


def test_each_node_has_its_hostname_nic_address_and_hosts_file(cluster: Cluster) -> None:
    nics = set()
    for i, node in enumerate(cluster.nodes[:4], start=1):
        result = cluster.exec(node, ["sh", "-c", "hostname; ls /sys/class/net; ip -o -4 addr show; cat /etc/hosts"])
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == node
        nic = next(n for n in lines[1:3] if n != "lo")
        nics.add(nic)
        assert f"{nic}    inet 198.18.0.{10 + i}/24" in result.stdout
        assert f"198.18.0.{10 + i} {node}" in result.stdout
        assert "127.0.1.1" not in result.stdout
    assert len(nics) == min(4, len(cluster.nodes))  # a different NIC name on every node
    assert "198.18.0." not in Path("/etc/hosts").read_text()  # the host's own file is untouched


def test_srun_from_the_host_spans_nodes_with_fake_gpus(cluster: Cluster) -> None:
    result = cluster.run(["srun", "-N2", "--ntasks-per-node=2", "--gpus-per-task=1", "sh", "-c",
                          "echo $(hostname) $SLURM_LOCALID $CUDA_VISIBLE_DEVICES"])
    assert result.returncode == 0, result.stderr
    lines = sorted(result.stdout.splitlines())
    hosts = {line.split()[0] for line in lines}
    assert len(hosts) == 2 and hosts <= set(cluster.nodes)
    assert {tuple(line.split()[1:]) for line in lines} == {("0", "0"), ("1", "1")}


def test_batch_job_runs_the_project_python_and_its_log_is_collected(cluster: Cluster) -> None:
    job = cluster.sbatch("#!/bin/bash\n#SBATCH --nodes=1\nhostname\nwhich python\necho conf=$SLURM_CONF\n")
    assert cluster.wait(job, timeout_s=30) == "COMPLETED"
    out = cluster.output(job).splitlines()
    assert out[0] in cluster.nodes
    assert out[1] == cluster.python
    assert out[2] == f"conf={cluster.config.slurm_conf}"
    assert any(name.endswith(f"-{job}.out") and cluster.python in text for name, text in cluster.logs())


def test_down_without_a_sandbox_is_harmless(cluster: Cluster, tmp_path: Path) -> None:
    empty = tmp_path / "no-sandbox-here"
    result = cli("sandbox", "down", "--lab-dir", str(empty))
    assert result.returncode == 0, result.stderr
    assert f"no sandbox in {empty}: nothing to do" in result.stdout
    assert sandbox.status(cluster.lab_dir).healthy


def test_a_second_sandbox_is_refused_while_one_is_up(cluster: Cluster, tmp_path: Path) -> None:
    result = cli("sandbox", "up", "--nodes", "2", "--lab-dir", str(tmp_path / "second"))
    assert result.returncode == 2
    assert f"error: a sandbox is already up in {cluster.lab_dir} (bridge tsbr0)" in result.stderr
    assert f"HINT: torchslurm sandbox down --lab-dir {cluster.lab_dir}" in result.stderr
    assert not (tmp_path / "second").exists()


def test_exec_runs_the_command_on_the_node(cluster: Cluster) -> None:
    result = cli("sandbox", "exec", "node2", "sh", "-c", "hostname; ls /sys/class/net")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["node2", "ens1f0", "lo"]


def test_exec_on_an_unknown_node_lists_the_valid_ones(cluster: Cluster) -> None:
    result = cli("sandbox", "exec", "--lab-dir", str(cluster.lab_dir), "node99", "hostname")
    assert result.returncode == 2
    assert "error: node 'node99' is not in the sandbox; valid nodes: node1," in result.stderr


def test_not_root_is_a_clear_error(cluster: Cluster) -> None:
    result = cli("sandbox", "up", user="65534")
    assert result.returncode == 2, result.stderr
    assert "error: torchslurm sandbox needs root (effective uid is 65534)" in result.stderr
    assert "HINT: sudo torchslurm sandbox up" in result.stderr


def test_a_failing_test_shows_its_job_logs(cluster: Cluster, tmp_path: Path) -> None:
    """The report hook: run a failing cluster test in an inner pytest (it reuses this sandbox)."""
    inner = tmp_path / "inner"
    inner.mkdir()
    shutil.copy(Path(__file__).with_name("conftest.py"), inner / "conftest.py")
    (inner / "test_inner.py").write_text(
        "def test_fails(cluster):\n"
        "    job = cluster.sbatch('#!/bin/bash\\necho marker-from-the-job-log')\n"
        "    assert cluster.wait(job, timeout_s=30) == 'COMPLETED'\n"
        "    assert False, 'inner failure'\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(inner),
                             str(inner / "test_inner.py")], capture_output=True, text=True, timeout=120, cwd=inner)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "inner failure" in result.stdout
    assert re.search(r"- job log \S+/job1\.sbatch-\d+\.out -", result.stdout), result.stdout[-3000:]
    assert "marker-from-the-job-log" in result.stdout
    assert sandbox.status(cluster.lab_dir).healthy  # the inner session reused the sandbox and left it up
