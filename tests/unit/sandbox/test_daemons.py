"""torchslurm.sandbox.daemons on ordinary processes and folders (no root, no Slurm): a pid file names a
daemon only while its pid is still that program, stopping waits for the process to end, the cgroup
folders slurmd leaves are removed only when empty."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchslurm.errors import SlurmError
from torchslurm.sandbox.config import SandboxConfig
from torchslurm.sandbox.daemons import daemon_pid_files, pid_alive, remove_cgroup_dirs, start_daemon, tail, terminate


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_a_pid_file_names_a_daemon_only_while_that_pid_is_the_program(tmp_path: Path) -> None:
    pid_file = tmp_path / "d.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    assert pid_alive(pid_file, _comm(os.getpid())) == os.getpid()
    assert pid_alive(pid_file, "slurmctld") is None  # the pid was reused by another program
    pid_file.write_text("not a pid\n")
    assert pid_alive(pid_file, _comm(os.getpid())) is None
    pid_file.write_text("")
    assert pid_alive(pid_file, _comm(os.getpid())) is None
    assert pid_alive(tmp_path / "absent.pid", "munged") is None


def test_every_daemon_of_a_lab_has_its_pid_file_and_program(tmp_path: Path) -> None:
    cfg = SandboxConfig(lab_dir=tmp_path / "lab", nodes=2)
    assert daemon_pid_files(cfg) == {
        "munged": (cfg.munged_pid_file, "munged"), "slurmctld": (cfg.slurmctld_pid_file, "slurmctld"),
        "slurmd@node1": (cfg.slurmd_pid_file(1), "slurmd"), "slurmd@node2": (cfg.slurmd_pid_file(2), "slurmd")}


def test_terminate_stops_a_process_that_ignores_sigterm() -> None:
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                                 "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
    terminate([stubborn.pid], grace_s=0.2)
    assert stubborn.wait(timeout=10) == -9  # TERM ignored, then KILL after the grace


def test_a_daemon_that_fails_to_start_is_an_error_with_its_output(tmp_path: Path) -> None:
    cfg = SandboxConfig(lab_dir=tmp_path / "lab")
    (cfg.lab_dir / "log").mkdir(parents=True)
    with pytest.raises(SlurmError, match=r"starting munged failed \(3\): line 1 \| no key") as info:
        start_daemon(cfg, "munged", ["sh", "-c", "echo line 1; echo no key; exit 3"])
    assert info.value.hint == f"see {cfg.lab_dir}/log"
    start_daemon(cfg, "slurmctld", ["true"])
    assert (cfg.lab_dir / "log" / "slurmctld.start.log").read_text() == ""


def test_tail_joins_the_last_lines_and_says_when_there_is_no_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(20)))
    assert tail(log, 3) == "line 17 | line 18 | line 19"
    assert tail(tmp_path / "absent.log") == "(no log)"


def test_only_empty_cgroup_folders_of_the_labs_nodes_are_removed(tmp_path: Path) -> None:
    cfg = SandboxConfig(lab_dir=tmp_path / "lab", nodes=2)
    (tmp_path / "cpu" / "slurm_node1" / "uid_0" / "job_3").mkdir(parents=True)
    (tmp_path / "memory" / "slurm_node2").mkdir(parents=True)
    busy = tmp_path / "cpu" / "slurm_node2" / "uid_0"
    busy.mkdir(parents=True)
    (busy / "tasks").write_text("123\n")  # a cgroup still in use: not empty
    (tmp_path / "cpu" / "slurm_node3").mkdir()  # not this lab's node
    assert sorted(remove_cgroup_dirs(cfg, root=tmp_path)) == [
        f"cgroup {tmp_path}/cpu/slurm_node1", f"cgroup {tmp_path}/memory/slurm_node2"]
    assert (busy / "tasks").exists() and (tmp_path / "cpu" / "slurm_node3").exists()
