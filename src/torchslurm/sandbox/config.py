"""What the local sandbox Slurm cluster looks like: names, addresses and config files. Pure.

A sandbox node is a network namespace (own NIC with its own name and a 198.18.0.x address on a
bridge), a UTS namespace (own hostname) and a mount namespace (a hosts file naming every node
bind-mounted over /etc/hosts), running a real slurmd. slurmctld runs in the root network namespace
on the bridge. Every decision is a function of `SandboxConfig`; `torchslurm.sandbox.cluster` carries
them out. The choices are made for Debian 12's Slurm 22.05 packages.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from torchslurm.errors import ConfigError
from torchslurm.runtime.variables import is_digits

DEFAULT_LAB_DIR = Path("/tmp/torchslurm-sandbox")
BRIDGE = "tsbr0"
CONTROLLER_NAME = "slurmctl"
CONTROLLER_ADDR = "198.18.0.1"
SUBNET_PREFIX = 24
NETNS_DIR = Path("/run/netns")
APT_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
# Which command proves each package is installed.
PACKAGE_COMMANDS = {"slurmctld": "slurmctld", "slurmd": "slurmd", "slurm-client": "sbatch", "munge": "munged"}
# Real clusters name NICs differently per node; the runtime must not assume one name everywhere.
NIC_NAMES = ("eth0", "ens1f0", "enp65s0f1", "eno1")
# 198.18.0.11-74; each node costs one slurmd (about 10 MB) and a namespace.
MAX_NODES = 64
MAX_GPUS_PER_NODE = 8
# Broadcast ARP probes before a neighbour counts as unreachable (Linux: 3, one a second). 64 nodes that
# connect all to all while 64 ranks start on 2 cores answered too late: connect() failed with "No route
# to host". Measured: 64 ranks meet with 20 or more.
ARP_PROBES = 20
STATE_FILE = "sandbox.json"
# Characters that would break slurm.conf or the shell lines that start the daemons.
_UNSAFE_PATH_CHARS = set(" \t\n#'\"\\$`;&|<>()*?[]{}!~:")


@dataclass(frozen=True)
class SandboxConfig:
    """One sandbox cluster. Validated at construction."""

    lab_dir: Path = DEFAULT_LAB_DIR
    """Directory holding every file of the sandbox (config, logs, state, munge key, fake GPUs)."""
    nodes: int = 4
    """Number of compute nodes (node1..nodeN), each its own namespaces and slurmd."""
    gpus_per_node: int = 4
    """Fake GPUs per node: gres backed by char devices, so Slurm sets CUDA_VISIBLE_DEVICES as on GPUs."""
    cpus_per_node: int = 4
    """CPUs each node declares to Slurm (more than the machine has is fine: config_overrides)."""
    python_bin: Path = field(default_factory=lambda: Path("/usr/bin"))
    """Directory put first on PATH for jobs, so they run the project's python, torchrun and torchslurm."""

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise ConfigError(
                f"--nodes={self.nodes} is out of range; the sandbox has 1 to {MAX_NODES} nodes.",
                "torchslurm sandbox up --nodes 4"
            )
        if not 0 <= self.gpus_per_node <= MAX_GPUS_PER_NODE:
            raise ConfigError(
                f"--gpus-per-node={self.gpus_per_node} is out of range; fake GPUs per node are 0 to "
                f"{MAX_GPUS_PER_NODE}.", "torchslurm sandbox up --gpus-per-node 4"
            )
        if not 1 <= self.cpus_per_node <= 256:
            raise ConfigError(
                f"--cpus-per-node={self.cpus_per_node} is out of range; it must be 1 to 256.",
                "torchslurm sandbox up --cpus-per-node 4"
            )
        # python_bin is no flag: it is the folder of the Python that runs torchslurm.
        for name, path, fix in (("--lab-dir", self.lab_dir, f"--lab-dir {DEFAULT_LAB_DIR}"),
                                ("python_bin", self.python_bin, "run torchslurm from a Python environment "
                                 "whose path is absolute and plain, e.g. python3 -m venv /opt/torchslurm-venv")):
            bad = sorted(set(str(path)) & _UNSAFE_PATH_CHARS)
            if not path.is_absolute() or bad:
                raise ConfigError(
                    f"{name}={str(path)!r} must be an absolute path without spaces, colons or shell characters "
                    f"(found {''.join(bad) or 'a relative path'}); Slurm config lines and PATH cannot quote them.",
                    fix
                )

    # Files under the lab directory.
    @property
    def etc(self) -> Path:
        return self.lab_dir / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def hosts_file(self) -> Path:
        return self.etc / "hosts"

    @property
    def env_file(self) -> Path:
        return self.lab_dir / "env.sh"

    @property
    def state_file(self) -> Path:
        return self.lab_dir / STATE_FILE

    @property
    def munge_dir(self) -> Path:
        return self.lab_dir / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.sock"

    @property
    def munged_pid_file(self) -> Path:
        return self.munge_dir / "munged.pid"

    @property
    def slurmctld_pid_file(self) -> Path:
        return self.lab_dir / "run" / "slurmctld.pid"

    def slurmd_pid_file(self, i: int) -> Path:
        return self.lab_dir / "run" / f"slurmd-{node_name(i)}.pid"

    def gpu_device(self, g: int) -> Path:
        return self.lab_dir / "dev" / f"nvidia{g}"

    def subdirs(self) -> list[Path]:
        """Directories `up` creates; spool/<node> is also each node's TmpFS (shared /tmp collides)."""
        names = ["etc", "log", "run", "state", "munge", "dev", "cgtmp", "spool"]
        return [self.lab_dir / n for n in names] + [
            self.lab_dir / "spool" / node_name(i) for i in self.node_indexes()
        ]

    def node_indexes(self) -> range:
        return range(1, self.nodes + 1)


def node_name(i: int) -> str:
    """Hostname and Slurm NodeName of node i (1-based)."""
    return f"node{i}"


def node_addr(i: int) -> str:
    return f"198.18.0.{10 + i}"


def nic_name(i: int) -> str:
    """The node's one NIC: a different name on every node, like a real heterogeneous cluster."""
    return NIC_NAMES[i - 1] if i <= len(NIC_NAMES) else f"ens{i}f0"


def netns_name(i: int) -> str:
    return f"tsnode{i}"


def veth_name(i: int) -> str:
    """Root-namespace end of node i's cable to the bridge."""
    return f"tsveth{i}"


def node_index(name: str, nodes: int) -> int:
    """`node3` (or `3`) → 3, checked against the sandbox's node count."""
    digits = name.removeprefix("node")
    if not is_digits(digits) or not 1 <= int(digits) <= nodes:
        valid = ", ".join(node_name(i) for i in range(1, nodes + 1))
        raise ConfigError(f"node {name!r} is not in the sandbox; valid nodes: {valid}.", "use one of them")
    return int(digits)


def _range(first: int, last: int) -> str:
    return str(first) if first == last else f"[{first}-{last}]"


def render_hosts(cfg: SandboxConfig) -> str:
    """/etc/hosts inside every namespace: real addresses only. A Debian `127.0.1.1 <hostname>`
    line would make the master's name resolve to loopback there, so Gloo binds loopback and the
    other nodes' ranks hang connecting to it.

    Each address also has a reverse-only line for its IPv4-mapped IPv6 form, under a name of its
    own: c10d's store client connects through a dual-stack IPv6 socket and looks up its own address
    (`::ffff:198.18.0.12`), which glibc's files backend, unlike its DNS backend, does not map back to
    IPv4; without the line every rank logs "The hostname of the client socket cannot be retrieved".
    The distinct name keeps forward lookups of the real names IPv4-only."""
    named = [(CONTROLLER_ADDR, CONTROLLER_NAME), *((node_addr(i), node_name(i)) for i in cfg.node_indexes())]
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
             *(f"{addr} {name}" for addr, name in named),
             *(f"::ffff:{addr} {name}-ipv4-mapped" for addr, name in [("127.0.0.1", "localhost"), *named])]
    return "\n".join(lines) + "\n"


def render_slurm_conf(cfg: SandboxConfig) -> str:
    """slurm.conf: every address an IP (nodes cannot resolve names outside the sandbox), per-node
    spool/pid/log/TmpFS via %n, no accounting (no slurmdbd), no cgroup plugins (fewer leftovers)."""
    lab, n = cfg.lab_dir, cfg.nodes
    gres = f" Gres=gpu:{cfg.gpus_per_node}" if cfg.gpus_per_node else ""
    node_line = (
        f"NodeName=node{_range(1, n)} NodeAddr=198.18.0.{_range(11, 10 + n)} CPUs={cfg.cpus_per_node} "
        f"Boards=1 SocketsPerBoard=1 CoresPerSocket={cfg.cpus_per_node} ThreadsPerCore=1 "
        f"RealMemory=2000{gres} State=UNKNOWN"
    )
    # Slurm's 10 s for a daemon's answer, but more beyond 16 nodes: there, all of them run on the same
    # few cores as the job's ranks, and 64 ranks importing torch on 2 cores kept a slurmd silent past
    # 10 s ("srun: error: Cannot communicate with node 9. Aborting job.", benchmarks/scale.py).
    message_timeout = 10 if n <= 16 else 60
    return f"""\
# Written by `torchslurm sandbox up`; removed by `torchslurm sandbox down`.
ClusterName=torchslurm-sandbox
SlurmctldHost={CONTROLLER_NAME}({CONTROLLER_ADDR})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={cfg.munge_socket}
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={lab}/state
SlurmdSpoolDir={lab}/spool/%n
TmpFS={lab}/spool/%n
SlurmctldPidFile={cfg.slurmctld_pid_file}
SlurmdPidFile={lab}/run/slurmd-%n.pid
SlurmctldLogFile={lab}/log/slurmctld.log
SlurmdLogFile={lab}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={cfg.etc}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
JobCompType=jobcomp/filetxt
JobCompLoc={lab}/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
SlurmctldTimeout=30
InactiveLimit=0
KillWait=30
MinJobAge=600
MessageTimeout={message_timeout}
{node_line}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def render_gres_conf(cfg: SandboxConfig) -> str:
    """Fake GPUs. No auto-detection: Debian's Slurm has gpu_generic only, never NVML."""
    if not cfg.gpus_per_node:
        return "AutoDetect=off\n"
    files = f"{cfg.lab_dir}/dev/nvidia{_range(0, cfg.gpus_per_node - 1)}"
    return f"AutoDetect=off\nNodeName=node{_range(1, cfg.nodes)} Name=gpu File={files}\n"


def render_cgroup_conf() -> str:
    """Read by slurmd even with task/none; only used by the cgroup plugins."""
    return "CgroupPlugin=cgroup/v1\nConstrainDevices=yes\nConstrainCores=yes\n"


def job_environ(cfg: SandboxConfig, base: Mapping[str, str]) -> dict[str, str]:
    """Environment for sbatch/srun/squeue run against the sandbox: SLURM_CONF set, the project's
    python first on PATH (sbatch exports it to jobs), and no leftover Slurm or torch.distributed
    variables from the caller that would confuse a job's rank detection."""
    drop_prefixes = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "TORCHELASTIC_")
    drop = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
            "MASTER_PORT", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES"}
    env = {k: v for k, v in base.items() if k not in drop and not k.startswith(drop_prefixes)}
    path = base.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env["PATH"] = f"{cfg.python_bin}:{path}"
    env["SLURM_CONF"] = str(cfg.slurm_conf)
    return env


def render_env_sh(cfg: SandboxConfig) -> str:
    """`source <lab>/env.sh` points sbatch/srun/squeue at the sandbox and puts the project's python first."""
    return (
        f"export SLURM_CONF={shlex.quote(str(cfg.slurm_conf))}\n"
        f"export PATH={shlex.quote(str(cfg.python_bin))}:\"$PATH\"\n"
    )


def network_commands(cfg: SandboxConfig) -> list[list[str]]:
    """ip commands that build the bridge and one namespace + veth per node. The peer is created
    directly inside the namespace under its final NIC name. The bridge's alias records the lab dir,
    so a later `status`/`down` (or a test session) can find a running sandbox."""
    cmds = [
        ["ip", "link", "add", BRIDGE, "type", "bridge"],
        ["ip", "link", "set", BRIDGE, "alias", str(cfg.lab_dir)],
        ["ip", "addr", "add", f"{CONTROLLER_ADDR}/{SUBNET_PREFIX}", "dev", BRIDGE],
        ["ip", "link", "set", BRIDGE, "up"],
        ["ip", "ntable", "change", "name", "arp_cache", "dev", BRIDGE, "mcast_probes", str(ARP_PROBES)],
    ]
    for i in cfg.node_indexes():
        ns, nic = netns_name(i), nic_name(i)
        cmds += [
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", veth_name(i), "type", "veth", "peer", "name", nic, "netns", ns],
            ["ip", "link", "set", veth_name(i), "master", BRIDGE, "up"],
            ["ip", "-n", ns, "addr", "add", f"{node_addr(i)}/{SUBNET_PREFIX}", "dev", nic],
            ["ip", "-n", ns, "link", "set", nic, "up"],
            ["ip", "-n", ns, "ntable", "change", "name", "arp_cache", "dev", nic, "mcast_probes", str(ARP_PROBES)],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
        ]
    return cmds


def munged_argv(cfg: SandboxConfig) -> list[str]:
    """One munged for all nodes: a unix socket reached by path ignores network namespaces."""
    m = cfg.munge_dir
    return ["munged", "--force", f"--socket={cfg.munge_socket}", f"--key-file={m}/munge.key",
            f"--pid-file={cfg.munged_pid_file}", f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"]


def slurmctld_argv(cfg: SandboxConfig) -> list[str]:
    """slurmctld in the root network namespace, with its own hostname and the sandbox hosts file."""
    q = shlex.quote
    script = (f"hostname {CONTROLLER_NAME} && mount --bind {q(str(cfg.hosts_file))} /etc/hosts && "
              f"exec slurmctld -f {q(str(cfg.slurm_conf))}")
    return ["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", script]


def slurmd_argv(cfg: SandboxConfig, i: int) -> list[str]:
    """slurmd inside node i's namespaces. `nsenter --net`, not `ip netns exec`: the latter remounts
    /sys (man ip-netns) and hides /sys/fs/cgroup, and slurmd 22.05 then refuses to start (its cgroup
    plugins find no cgroup tree).
    We remount sysfs ourselves (so /sys/class/net lists only this node's NICs) and move the host's
    cgroup tree back under it."""
    q = shlex.quote
    cg = q(str(cfg.lab_dir / "cgtmp"))
    script = (
        f"hostname {node_name(i)} && mount --bind {q(str(cfg.hosts_file))} /etc/hosts && "
        f"mount --rbind /sys/fs/cgroup {cg} && mount -t sysfs sysfs /sys && "
        f"mount --move {cg} /sys/fs/cgroup && "
        f"exec slurmd -f {q(str(cfg.slurm_conf))}"
    )
    return ["nsenter", f"--net={NETNS_DIR / netns_name(i)}", "unshare", "--uts", "--mount",
            "--propagation", "private", "sh", "-c", script]


def exec_argv(slurmd_pid: int, argv: list[str]) -> list[str]:
    """Run argv "on" a node: in the same net, UTS and mount namespaces as that node's slurmd."""
    return ["nsenter", "-t", str(slurmd_pid), "-n", "-u", "-m", "--", *argv]


def missing_packages(which: Mapping[str, str | None]) -> list[str]:
    """Packages whose command is not found; `which` maps command → path or None."""
    return [pkg for pkg, cmd in PACKAGE_COMMANDS.items() if not which.get(cmd)]


def state_json(cfg: SandboxConfig) -> str:
    """The record `up` writes before creating anything, so `down` can undo a half-finished `up`."""
    return json.dumps({
        "lab_dir": str(cfg.lab_dir), "nodes": cfg.nodes, "gpus_per_node": cfg.gpus_per_node,
        "cpus_per_node": cfg.cpus_per_node, "python_bin": str(cfg.python_bin), "bridge": BRIDGE,
        "netns": [netns_name(i) for i in cfg.node_indexes()],
    }, indent=2) + "\n"


def config_from_state(text: str) -> SandboxConfig:
    """Inverse of `state_json`."""
    data = json.loads(text)
    return SandboxConfig(lab_dir=Path(data["lab_dir"]), nodes=int(data["nodes"]),
                         gpus_per_node=int(data["gpus_per_node"]), cpus_per_node=int(data["cpus_per_node"]),
                         python_bin=Path(data["python_bin"]))


def parse_sinfo_states(text: str) -> dict[str, str]:
    """`sinfo -h -N -o '%N %t'` → {node: state}; a state may carry a flag suffix like `idle*`."""
    states: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states
