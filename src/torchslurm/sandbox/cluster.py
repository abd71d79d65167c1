"""The local sandbox Slurm cluster: bring it up, inspect it, run commands on a node, tear it down.

Thin effects over `torchslurm.sandbox.config` (which decides every name, address and file). Needs
root: network namespaces, bind mounts and the Slurm daemons. `up` records what it will create in
`<lab>/sandbox.json` before creating it, so `down` undoes exactly that, even after a failed `up`,
and never touches daemons, namespaces or files it did not create.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchslurm.errors import ConfigError, EnvError, SlurmError, TorchSlurmError
from torchslurm.sandbox import trust
from torchslurm.sandbox.config import (
    APT_PACKAGES,
    BRIDGE,
    DEFAULT_LAB_DIR,
    NETNS_DIR,
    PACKAGE_COMMANDS,
    STATE_FILE,
    SandboxConfig,
    config_from_state,
    exec_argv,
    job_environ,
    missing_packages,
    munged_argv,
    netns_name,
    network_commands,
    node_index,
    node_name,
    parse_sinfo_states,
    render_cgroup_conf,
    render_env_sh,
    render_gres_conf,
    render_hosts,
    render_slurm_conf,
    slurmctld_argv,
    slurmd_argv,
    state_json,
    veth_name,
)
from torchslurm.sandbox.daemons import (
    SYSTEM_PATH,
    daemon_pid_files,
    pid_alive,
    remove_cgroup_dirs,
    start_daemon,
    tail,
    terminate,
)

logger = logging.getLogger(__name__)

LOCK_FILE = Path("/tmp/torchslurm-sandbox.lock")
READY_STATES = {"idle", "mix", "mixed", "alloc", "allocated", "comp", "completing"}


@dataclass(frozen=True)
class SandboxStatus:
    """What is running for one lab directory."""

    lab_dir: Path
    config: SandboxConfig | None
    """The recorded config, or None when nothing was brought up in this lab directory."""
    daemons: dict[str, int | None] = field(default_factory=dict)
    """Daemon name (munged, slurmctld, slurmd@nodeN) → its live pid, or None when not running."""
    node_states: dict[str, str] = field(default_factory=dict)
    """sinfo's state per node (idle, alloc, down*, ...)."""
    started: bool = False
    """True when the `up` call that returned this brought the sandbox up (False: it was already up)."""

    @property
    def healthy(self) -> bool:
        return (self.config is not None and bool(self.daemons) and all(self.daemons.values())
                and len(self.node_states) == self.config.nodes)

    @property
    def environ(self) -> dict[str, str]:
        """The environment to run sbatch/srun/squeue against this sandbox."""
        if self.config is None:
            raise EnvError(f"no sandbox in {self.lab_dir}.", f"torchslurm sandbox up --lab-dir {self.lab_dir}")
        return job_environ(self.config, os.environ)


def require_root(euid: int | None = None) -> None:
    """The sandbox creates namespaces, bind mounts and mknods: only root can."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        raise EnvError(
            f"torchslurm sandbox needs root (effective uid is {euid}): it creates network namespaces "
            "and starts slurmctld/slurmd.", "sudo torchslurm sandbox up"
        )


def default_config(lab_dir: Path | None = None, **kwargs: int) -> SandboxConfig:
    """A config whose jobs run this interpreter's environment (its bin dir first on PATH)."""
    return SandboxConfig(lab_dir=lab_dir or DEFAULT_LAB_DIR, python_bin=Path(sys.executable).parent, **kwargs)


def running_lab_dir() -> Path | None:
    """Lab directory of the sandbox whose bridge exists (recorded as the bridge's alias)."""
    try:
        alias = Path(f"/sys/class/net/{BRIDGE}/ifalias").read_text().strip()
    except OSError:
        return None
    return Path(alias) if alias else None


def resolve_lab_dir(lab_dir: Path | None) -> Path:
    """The lab dir asked for, else the running sandbox's, else the default."""
    return lab_dir or running_lab_dir() or DEFAULT_LAB_DIR


def load_config(lab_dir: Path) -> SandboxConfig | None:
    """The sandbox recorded in `lab_dir`, read only from a folder and file that root alone could have
    written (sandbox.trust), and only when it names that folder: `down` deletes what it names."""
    state, lab = lab_dir / STATE_FILE, Path(os.path.abspath(lab_dir))
    if not all(trust.existing(p, kind) for p, kind in ((lab.parent, "parent"), (lab, "dir"), (state, "file"))):
        return None
    try:
        cfg = config_from_state(state.read_text())
    except TorchSlurmError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise EnvError(f"{state} cannot be read ({exc}).", f"torchslurm sandbox down --lab-dir {lab}") from exc
    if cfg.lab_dir != lab:
        raise EnvError(f"{state} names the lab directory {cfg.lab_dir}, but lies in {lab}; `down` would delete "
                       f"{cfg.lab_dir}.", f"remove {state} (it was not written by `sandbox up` there).")
    return cfg


def _run(argv: Sequence[str], check: bool = True, env: Mapping[str, str] | None = None,
         timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                            env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise SlurmError(f"`{' '.join(argv)}` failed ({result.returncode}): {result.stderr.strip()}.",
                         "torchslurm sandbox down, then up again; see the message for the cause")
    return result


def ensure_packages(run: Callable[..., subprocess.CompletedProcess[str]] = _run,
                    which: Callable[..., str | None] = shutil.which) -> list[str]:
    """apt-get install Debian's Slurm and munge when missing; returns the packages installed."""
    search = f"{os.environ.get('PATH', '')}:{SYSTEM_PATH}"
    missing = missing_packages({cmd: which(cmd, path=search) for cmd in PACKAGE_COMMANDS.values()})
    if not missing:
        return []
    if not which("apt-get", path=search):
        raise EnvError(f"Slurm packages missing ({', '.join(missing)}) and apt-get not found; the sandbox "
                       "needs Debian's Slurm 22.05.", f"install {' '.join(APT_PACKAGES)} with your package manager")
    logger.info("installing %s with apt-get", " ".join(missing))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], env=env, timeout_s=600)
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *APT_PACKAGES], env=env, timeout_s=600)
    return missing


def _write_files(cfg: SandboxConfig) -> None:
    trust.make_lab_dir(cfg.lab_dir)  # root's alone: what is inside is then root's too
    cfg.state_file.write_text(state_json(cfg))  # first, so `down` can undo whatever follows
    for d in cfg.subdirs():
        d.mkdir(parents=True, exist_ok=True)
    cfg.munge_dir.chmod(0o755)  # munged warns about a 0700 socket dir
    key = cfg.munge_dir / "munge.key"
    if not trust.existing(key, "file"):  # never another user's key
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
    cfg.hosts_file.write_text(render_hosts(cfg))
    cfg.slurm_conf.write_text(render_slurm_conf(cfg))
    (cfg.etc / "gres.conf").write_text(render_gres_conf(cfg))
    (cfg.etc / "cgroup.conf").write_text(render_cgroup_conf())
    (cfg.etc / "plugstack.conf").write_text("")
    cfg.env_file.write_text(render_env_sh(cfg))
    for g in range(cfg.gpus_per_node):
        # Gres File= must be a char device (slurmd rejects regular files); major 195 like /dev/nvidiaN.
        dev = cfg.gpu_device(g)
        if not dev.exists():
            os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(195, g))
            dev.chmod(0o666)


def _sinfo(cfg: SandboxConfig) -> dict[str, str]:
    env = job_environ(cfg, {"PATH": SYSTEM_PATH})
    result = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                            env=env, timeout=30, stdin=subprocess.DEVNULL)
    return parse_sinfo_states(result.stdout) if result.returncode == 0 else {}


def wait_ready(cfg: SandboxConfig, timeout_s: float | None = None) -> dict[str, str]:
    """Poll sinfo until every node is up (idle, or running jobs); by default 30 s plus 1 s a node."""
    timeout_s = 30.0 + cfg.nodes if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    while True:
        states = _sinfo(cfg)
        if len(states) == cfg.nodes and all(s.rstrip("*~#%$@+-") in READY_STATES and not s.endswith("*")
                                            for s in states.values()):
            return states
        if time.monotonic() > deadline:
            logs = "; ".join(f"{n}: {tail(cfg.lab_dir / 'log' / f'slurmd-{n}.log', 3)}"
                             for n in states or ["?"])
            raise SlurmError(
                f"sandbox nodes not ready after {timeout_s:.0f} s: sinfo says {states or 'nothing'}; {logs}.",
                f"check {cfg.lab_dir}/log/slurmctld.log, then torchslurm sandbox down")
        time.sleep(0.1)


def status(lab_dir: Path | None = None) -> SandboxStatus:
    """Which daemons of this lab are alive and what sinfo says about its nodes."""
    lab = resolve_lab_dir(lab_dir)
    cfg = load_config(lab)
    if cfg is None:
        return SandboxStatus(lab_dir=lab, config=None)
    daemons = {name: pid_alive(f, comm) for name, (f, comm) in daemon_pid_files(cfg).items()}
    states = _sinfo(cfg) if daemons["slurmctld"] and daemons["munged"] else {}
    return SandboxStatus(lab_dir=lab, config=cfg, daemons=daemons, node_states=states)


def up(cfg: SandboxConfig) -> SandboxStatus:
    """Bring the sandbox up; a no-op when the same sandbox is already up and healthy."""
    require_root()
    with trust.locked(LOCK_FILE):
        other = running_lab_dir()
        if other is not None and other != cfg.lab_dir:
            raise ConfigError(f"a sandbox is already up in {other} (bridge {BRIDGE}), not in {cfg.lab_dir}; "
                              "only one can run at a time.", f"torchslurm sandbox down --lab-dir {other}")
        old = load_config(cfg.lab_dir)
        if old is not None:
            current = status(cfg.lab_dir)
            if current.healthy and (old.nodes, old.gpus_per_node, old.cpus_per_node) == (
                    cfg.nodes, cfg.gpus_per_node, cfg.cpus_per_node):
                logger.info("sandbox already up in %s", cfg.lab_dir)
                return current
            if current.healthy:
                raise ConfigError(
                    f"the sandbox in {cfg.lab_dir} is up with --nodes={old.nodes} --gpus-per-node="
                    f"{old.gpus_per_node}, not --nodes={cfg.nodes} --gpus-per-node={cfg.gpus_per_node}.",
                    f"torchslurm sandbox down --lab-dir {cfg.lab_dir}, then up again")
            logger.info("cleaning up a half-running sandbox in %s", cfg.lab_dir)
            _down(old)
        elif cfg.lab_dir.exists() and any(cfg.lab_dir.iterdir()):
            raise ConfigError(f"--lab-dir={cfg.lab_dir} exists and is not a sandbox (no sandbox.json); "
                              "`down` would delete it.", "pass an empty or new directory as --lab-dir")
        elif other is not None or any((NETNS_DIR / netns_name(i)).exists() for i in cfg.node_indexes()):
            # A crashed sandbox whose files are gone (e.g. /tmp was cleaned): only its network remains.
            logger.info("removing a stale sandbox network")
            _down(cfg)
        ensure_packages()
        try:
            return _up(cfg)
        except BaseException:
            _down(cfg)
            raise


def _up(cfg: SandboxConfig) -> SandboxStatus:
    t0 = time.monotonic()
    _write_files(cfg)
    start_daemon(cfg, "munged", munged_argv(cfg))
    for argv in network_commands(cfg):
        _run(argv)
    start_daemon(cfg, "slurmctld", slurmctld_argv(cfg))
    for i in cfg.node_indexes():
        start_daemon(cfg, f"slurmd-{node_name(i)}", slurmd_argv(cfg, i))
    wait_ready(cfg)
    logger.info("sandbox up in %.1f s: %d nodes in %s", time.monotonic() - t0, cfg.nodes, cfg.lab_dir)
    return dataclasses.replace(status(cfg.lab_dir), started=True)


def down(lab_dir: Path | None = None) -> list[str]:
    """Stop what `up` started in this lab dir and remove it; returns what was removed (empty: nothing up)."""
    require_root()
    with trust.locked(LOCK_FILE):
        cfg = load_config(resolve_lab_dir(lab_dir))
        return _down(cfg) if cfg is not None else []


def _down(cfg: SandboxConfig) -> list[str]:
    t0 = time.monotonic()
    ours = trust.existing(cfg.lab_dir.parent, "parent") and trust.existing(cfg.lab_dir, "dir")  # else: EnvError
    removed: list[str] = []
    daemons = {name: pid_alive(f, comm) for name, (f, comm) in daemon_pid_files(cfg).items()}
    terminate([pid for pid in daemons.values() if pid])
    removed += [f"{name} (pid {pid})" for name, pid in daemons.items() if pid]
    for i in cfg.node_indexes():
        ns = netns_name(i)
        if not (NETNS_DIR / ns).exists():
            continue
        # Job steps left in the node (slurmstepd, tasks): nothing outside the namespace owns them.
        pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(f"netns {ns}")
    if running_lab_dir() == cfg.lab_dir:
        _run(["ip", "link", "del", BRIDGE], check=False)
        removed.append(f"bridge {BRIDGE}")
    for i in cfg.node_indexes():
        # A veth pair normally dies with its namespace, but the namespace outlives `ip netns del`
        # while anything still holds it; deleting our end removes both ends at once.
        if Path(f"/sys/class/net/{veth_name(i)}").exists():
            _run(["ip", "link", "del", veth_name(i)], check=False)
            removed.append(f"veth {veth_name(i)}")
    removed += remove_cgroup_dirs(cfg)
    if ours:
        shutil.rmtree(cfg.lab_dir, ignore_errors=True)
        removed.append(f"dir {cfg.lab_dir}")
    logger.info("sandbox down in %.1f s", time.monotonic() - t0)
    return removed


def node_exec_argv(node: str, argv: Sequence[str], lab_dir: Path | None = None) -> list[str]:
    """argv wrapped to run inside node's namespaces (same hostname, NIC and hosts file as its jobs)."""
    lab = resolve_lab_dir(lab_dir)
    cfg = load_config(lab)
    if cfg is None:
        raise EnvError(f"no sandbox in {lab}.", "torchslurm sandbox up")
    i = node_index(node, cfg.nodes)
    pid = pid_alive(cfg.slurmd_pid_file(i), "slurmd")
    if pid is None:
        raise SlurmError(f"slurmd of {node_name(i)} is not running in {lab}.",
                         "torchslurm sandbox down && torchslurm sandbox up")
    if not argv:
        raise ConfigError(f"no command given to run on {node}.", f"torchslurm sandbox exec {node} hostname")
    return exec_argv(pid, list(argv))
