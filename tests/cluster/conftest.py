"""Cluster tests run against the real sandbox Slurm cluster (`torchslurm sandbox`).

Use the function-scoped `cluster` fixture; it is a `Cluster`:

    cluster.environ           dict for subprocesses: SLURM_CONF, PATH with the project's venv first
    cluster.job_dir           fresh per-test directory on the shared filesystem (every node sees it)
    cluster.python            the project's python (jobs can run it: same filesystem)
    cluster.nodes             ["node1", ...]; cluster.require_nodes(4) skips when fewer are up
    cluster.require_gpus_per_node(4) skips when the running sandbox has fewer fake GPUs
    cluster.lab_dir           the sandbox's directory
    cluster.sbatch(script, *args) -> job_id
        script: the script's text (written into job_dir) or a Path. Unless given, adds
        --output=<job_dir>/%x-%j.out, --chdir=<job_dir>, --time=5 (minutes).
    cluster.wait(job_id, timeout_s=120) -> final state ("COMPLETED", "FAILED", ...); polls every 0.2 s
    cluster.job(job_id) -> dict of `scontrol show job` fields (accounting is off: no sacct)
    cluster.output(job_id) -> the job's stdout file text
    cluster.echoed_exit(job_id, step) -> the exit code the script echoed as `<step> exit $?`
    cluster.text(pattern) -> the job_dir files matching pattern, joined
    cluster.run(argv, timeout_s=60) -> CompletedProcess (root namespace: sbatch, srun, squeue ...)
    cluster.exec(node, argv, timeout_s=60) -> CompletedProcess inside that node's namespaces

For a module-scoped fixture use `cluster_factory(job_dir)`, which returns such a Cluster.

The sandbox (4 nodes x 4 fake GPUs) comes up once per pytest session and goes down at its end,
after which a check fails the run if any daemon, namespace or bridge is left. A sandbox that is
already up when the session starts is reused and left up. Jobs a test leaves running are
cancelled when it ends. A failing test's report shows every log file in its job_dir.
Without root (or without ip/unshare/nsenter) cluster tests skip.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from torchslurm.sandbox import cluster as sandbox
from torchslurm.sandbox.config import BRIDGE, SandboxConfig

FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED", "SPECIAL_EXIT"}
USERS_LOCK = Path("/tmp/torchslurm-sandbox.users")
SLURM_PROCESSES = {"slurmctld", "slurmd", "slurmstepd", "munged"}


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "cluster tests need root for the sandbox Slurm cluster; run as root: sudo make test"
    missing = [t for t in ("ip", "unshare", "nsenter") if shutil.which(t, path=f"{os.environ.get('PATH')}:"
                                                                       f"{sandbox.SYSTEM_PATH}") is None]
    if missing:
        return f"cluster tests need {', '.join(missing)} (iproute2, util-linux); install them, then: sudo make test"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = unavailable_reason()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.skip(reason=reason))


class Cluster:
    """One test's handle on the sandbox (see the module docstring)."""

    def __init__(self, cfg: SandboxConfig, job_dir: Path) -> None:
        self.config = cfg
        self.lab_dir = cfg.lab_dir
        self.job_dir = job_dir
        self.nodes = [f"node{i}" for i in cfg.node_indexes()]
        self.python = str(cfg.python_bin / "python")
        self.environ = sandbox.job_environ(cfg, os.environ)
        self.job_ids: list[str] = []
        self._scripts = 0

    def require_nodes(self, n: int) -> None:
        if len(self.nodes) < n:
            pytest.skip(f"needs {n} sandbox nodes, the running sandbox has {len(self.nodes)}; "
                        f"torchslurm sandbox down, then rerun (the fixture brings up 4)")

    def require_gpus_per_node(self, n: int) -> None:
        if self.config.gpus_per_node < n:
            pytest.skip(f"needs {n} fake GPUs per node, the running sandbox has {self.config.gpus_per_node}; "
                        f"torchslurm sandbox down, then rerun (the fixture brings up 4)")

    def run(self, argv: Sequence[str], timeout_s: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
        kw.setdefault("env", self.environ)
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, **kw)

    def exec(self, node: str, argv: Sequence[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return self.run(sandbox.node_exec_argv(node, argv, self.lab_dir), timeout_s=timeout_s)

    def sbatch(self, script: str | Path, *args: str) -> str:
        if isinstance(script, str):
            self._scripts += 1
            path = self.job_dir / f"job{self._scripts}.sbatch"
            path.write_text(script)
            script = path
        text = script.read_text()
        given = " ".join(args) + "\n" + text
        extra = []
        if not re.search(r"(--output|-o)[ =]", given):
            extra.append(f"--output={self.job_dir}/%x-%j.out")
        if "--chdir" not in given and not re.search(r"-D[ =]", given):
            extra.append(f"--chdir={self.job_dir}")
        if not re.search(r"(--time|-t)[ =]", given):
            extra.append("--time=5")
        result = self.run(["sbatch", "--parsable", *extra, *args, str(script)])
        assert result.returncode == 0, f"sbatch {script} failed: {result.stderr}"
        job_id = result.stdout.strip().split(";")[0]
        self.job_ids.append(job_id)
        return job_id

    def job(self, job_id: str) -> dict[str, str]:
        result = self.run(["scontrol", "show", "job", "-o", job_id])
        fields: dict[str, str] = {}
        for m in re.finditer(r"(\w[\w:/]*)=(\S*)", result.stdout):
            fields.setdefault(m.group(1), m.group(2))
        return fields

    def wait(self, job_id: str, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        state = "?"
        while time.monotonic() < deadline:
            state = self.job(job_id).get("JobState", "?")
            if state in FINAL_STATES:
                return state
            time.sleep(0.2)
        self.run(["scancel", job_id])
        raise AssertionError(f"job {job_id} still {state} after {timeout_s} s (cancelled): {self.job(job_id)}")

    def output(self, job_id: str) -> str:
        path = self.job(job_id).get("StdOut", "")
        return Path(path).read_text(errors="replace") if path and Path(path).exists() else ""

    def echoed_exit(self, job_id: str, step: str) -> int:
        """The exit code a job script echoed as `<step> exit $?` (scripts that run one step after another)."""
        output = self.output(job_id)
        found = re.search(rf"^{step} exit (\d+)$", output, re.MULTILINE)
        assert found, output[-4000:]
        return int(found.group(1))

    def text(self, pattern: str) -> str:
        """The files of job_dir matching `pattern` (e.g. every task's output of one step), joined."""
        return "".join(p.read_text() for p in sorted(self.job_dir.glob(pattern)))

    def logs(self) -> list[tuple[str, str]]:
        """Every log-like file in job_dir, plus stdout/stderr files of this test's jobs kept elsewhere."""
        files = {p for p in self.job_dir.rglob("*") if p.is_file() and p.suffix in {".out", ".err", ".log", ".txt",
                                                                                   ".jsonl", ".json"}}
        for job_id in self.job_ids:
            fields = self.job(job_id)
            files |= {Path(fields[k]) for k in ("StdOut", "StdErr") if fields.get(k)}
        out = []
        for path in sorted(files):
            if path.is_file():
                text = path.read_text(errors="replace")
                out.append((str(path), text[-20000:]))
        return out

    def cancel_running(self) -> None:
        alive = [j for j in self.job_ids if self.job(j).get("JobState") not in FINAL_STATES]
        if alive:
            self.run(["scancel", *alive])


def _leftovers(cfg: SandboxConfig) -> list[str]:
    """What a clean `down` must not leave: Slurm/munge processes, node namespaces, the bridge, files."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            comm = (proc / "comm").read_text().strip()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if comm in SLURM_PROCESSES and state != "Z":
            found.append(f"process {comm} (pid {proc.name})")
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith("tsnode")]
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        found.append(f"bridge {BRIDGE}")
    if cfg.lab_dir.exists():
        found.append(f"dir {cfg.lab_dir}")
    return found


@pytest.fixture(scope="session")
def sandbox_cluster() -> Iterator[SandboxConfig]:
    """The sandbox for the whole session: reused when already up, else brought up and torn down."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with open(USERS_LOCK, "a") as users:
        # Every session using the sandbox holds a shared lock; the one that started it tears it
        # down only if no other session is still using it.
        fcntl.flock(users, fcntl.LOCK_SH)
        lab = sandbox.running_lab_dir()
        cfg = sandbox.default_config(lab, nodes=4, gpus_per_node=4)
        current = sandbox.status(lab) if lab else None
        if current is not None and current.healthy and current.config is not None:
            cfg, started = current.config, False
        else:
            t0 = time.monotonic()
            started = sandbox.up(cfg).started
            print(f"\nsandbox up in {time.monotonic() - t0:.2f} s ({cfg.lab_dir})")
        yield cfg
        if not started:
            return
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"\nsandbox left up in {cfg.lab_dir}: another test session is using it")
            return
        t0 = time.monotonic()
        sandbox.down(cfg.lab_dir)
        print(f"\nsandbox down in {time.monotonic() - t0:.2f} s")
        left = _leftovers(cfg)
        assert not left, f"`sandbox down` left behind: {left}"


@pytest.fixture(scope="session")
def cluster_factory(sandbox_cluster: SandboxConfig) -> Callable[[Path], Cluster]:
    """For module-scoped fixtures: `cluster_factory(job_dir)` → a Cluster writing into job_dir."""
    return lambda job_dir: Cluster(sandbox_cluster, job_dir)


@pytest.fixture
def cluster(sandbox_cluster: SandboxConfig, tmp_path: Path) -> Iterator[Cluster]:
    handle = Cluster(sandbox_cluster, tmp_path)
    yield handle
    handle.cancel_running()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not (report.failed and report.when == "call"):
        return
    for handle in getattr(item, "funcargs", {}).values():
        if isinstance(handle, Cluster):
            for name, text in handle.logs():
                report.sections.append((f"job log {name}", text))
