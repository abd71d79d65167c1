"""The sandbox's daemons as processes: started (each forks itself into the background), found by
their pid files (only while the pid is still the program it was: pids get reused), stopped, and the
cgroup folders slurmd leaves behind removed. Effects only; torchslurm.sandbox.cluster decides when.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from torchslurm.errors import SlurmError
from torchslurm.sandbox.config import SandboxConfig, node_name

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def pid_alive(pid_file: Path, comm: str) -> int | None:
    """The pid in pid_file if that process is alive *and* is the expected program (pids get reused)."""
    try:
        pid = int(pid_file.read_text().split()[0])
        actual = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError, IndexError):
        return None
    return pid if actual == comm else None


def daemon_pid_files(cfg: SandboxConfig) -> dict[str, tuple[Path, str]]:
    files = {"munged": (cfg.munged_pid_file, "munged"), "slurmctld": (cfg.slurmctld_pid_file, "slurmctld")}
    for i in cfg.node_indexes():
        files[f"slurmd@{node_name(i)}"] = (cfg.slurmd_pid_file(i), "slurmd")
    return files


def start_daemon(cfg: SandboxConfig, name: str, argv: list[str]) -> None:
    """Start a daemon that forks itself into the background; its launcher's output goes to a log."""
    log = cfg.lab_dir / "log" / f"{name}.start.log"
    with open(log, "w") as out:
        rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                            timeout=60, env={**os.environ, "PATH": SYSTEM_PATH}).returncode
    if rc != 0:
        raise SlurmError(f"starting {name} failed ({rc}): {tail(log)}.", f"see {cfg.lab_dir}/log")


def tail(path: Path, lines: int = 15) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def terminate(pids: list[int], grace_s: float = 5.0) -> None:
    """TERM, wait up to grace_s for all, then KILL the rest (slurmctld takes 3-4 s to stop)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if Path(f"/proc/{p}").exists() and not is_zombie(p)]
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def remove_cgroup_dirs(cfg: SandboxConfig, root: Path = Path("/sys/fs/cgroup")) -> list[str]:
    """Empty `slurm_<node>` cgroup dirs that slurmd's cgroup code leaves behind."""
    removed = []
    for i in cfg.node_indexes():
        for top in root.glob(f"*/slurm_{node_name(i)}"):
            for d in [*sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True), top]:
                with contextlib.suppress(OSError):
                    if d.is_dir():
                        d.rmdir()
            if not top.exists():
                removed.append(f"cgroup {top}")
    return removed
