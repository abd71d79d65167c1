"""`torchslurm doctor`'s checks: the seeds' troubleshooting sections as pure functions that find the fault.

Each check is a pure function of recorded `Facts` (the environ mapping, this host's interfaces,
what MASTER_ADDR resolves to, torch's versions, which Slurm commands are on PATH) and returns a
`Check(name, status, detail, hint)`; `run_checks` runs them all and `report` gathers them into a
`Report`. No effects here: torchslurm.probe records the facts (`gather`) and tries a real process
group (`check_connect`); rendering lives in the CLI (torchslurm.cli.doctor), the only place that prints.

The placement, device and NIC decisions are the runtime's own (distenv, devices, netif): the
doctor reports what `torchslurm.init()` would do here and why, and what would break.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from torchslurm import devices, distenv, hostlist, netif
from torchslurm.errors import ConfigError, EnvError, TorchSlurmError
from torchslurm.launch import gpus_on_node
from torchslurm.netif import IfAddr

__all__ = ["Check", "Facts", "Report", "TorchFacts", "missing_ranks", "report", "run_checks"]

logger = logging.getLogger(__name__)

Status = Literal["ok", "warn", "fail"]
SLURM_COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
DEBUG_HINT = "for a hang, rerun with NCCL_DEBUG=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL to see where it stops"


@dataclass(frozen=True)
class Check:
    """One finding."""

    name: str
    """What was checked: placement, torch, gpus, backend, master_addr, master_port, ... ."""
    status: Status
    """ok, warn (legal but probably not what you want) or fail (training will not work)."""
    detail: str
    """What was found, naming the variables and their values."""
    hint: str = ""
    """The fix, when status is not ok."""
    value: str = ""
    """The short answer for scripts (launcher, device, interface name, version), may be empty."""


@dataclass(frozen=True)
class TorchFacts:
    """What the installed torch offers."""

    version: str
    """torch.__version__."""
    cuda: str | None
    """torch.version.cuda; None for a CPU-only build."""
    cuda_device_count: int
    """torch.cuda.device_count() in this process."""
    nccl: str | None
    """NCCL version torch was built with; None without NCCL."""
    gloo: bool
    """torch.distributed has the Gloo backend."""


@dataclass(frozen=True)
class Facts:
    """Everything the checks look at, recorded once by `torchslurm.probe.gather()` (tests build it by hand)."""

    environ: Mapping[str, str]
    """The process environment."""
    hostname: str = "localhost"
    """socket.gethostname()."""
    torch: TorchFacts | None = None
    """None when torch cannot be imported."""
    torch_error: str = ""
    """Why torch could not be imported."""
    interfaces: tuple[IfAddr, ...] = ()
    """This host's UP interfaces and addresses."""
    master_ips: tuple[str, ...] = ()
    """What the master's name resolves to here (empty when it does not)."""
    resolve_error: str = ""
    """The resolver's complaint when the master's name does not resolve."""
    source: str | None = None
    """The local address the kernel would use to reach the master; None when unroutable."""
    own_addresses: tuple[str, ...] = ()
    """What this host's own name resolves to."""
    first_node_ips: tuple[str, ...] = ()
    """What the first node of the Slurm step (where rank 0 runs) resolves to; empty outside Slurm."""
    infiniband: tuple[str, ...] = ()
    """InfiniBand devices of this host (/sys/class/infiniband)."""
    commands: Mapping[str, str | None] = field(default_factory=dict)
    """Slurm client command → its path on PATH, or None."""
    python: str = ""
    """sys.executable."""


@dataclass(frozen=True)
class Report:
    """The doctor's findings for one process."""

    host: str
    rank: int | None
    world_size: int | None
    launcher: str | None
    checks: tuple[Check, ...]

    @property
    def failed(self) -> bool:
        return any(check.status == "fail" for check in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "rank": self.rank, "world_size": self.world_size, "launcher": self.launcher,
                "ok": not self.failed, "checks": [asdict(check) for check in self.checks]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Report:
        """The inverse of `to_json` (a rank's line read back by `doctor --ranks`); KeyError/TypeError if not one."""
        checks = tuple(Check(c["name"], c["status"], c["detail"], c.get("hint", ""), c.get("value", ""))
                       for c in data["checks"])
        return cls(str(data["host"]), data["rank"], data["world_size"], data["launcher"], checks)


def missing_ranks(reports: Sequence[Report]) -> list[int]:
    """Ranks that should have reported (0 … world_size-1 of the largest world seen) but did not."""
    expected = max((r.world_size or 1 for r in reports), default=0)
    return sorted(set(range(expected)) - {r.rank for r in reports})


# ---- the checks (pure) ---------------------------------------------------------------------------


def placement(environ: Mapping[str, str]) -> distenv.DistEnv | None:
    """The runtime's placement decision, or None when the environment contradicts itself."""
    try:
        return distenv.detect(environ, free_port=lambda: 0)
    except EnvError:
        return None


def master_name(env: distenv.DistEnv, environ: Mapping[str, str]) -> str:
    """The master the job's ranks will use. In a batch shell that is not the shell's own
    127.0.0.1 but the first node of the job: where `srun`/`torchslurm run` put rank 0."""
    if env.launcher == "batch" and not environ.get("MASTER_ADDR"):
        return first_node(env, environ) or env.master_addr
    return env.master_addr


def first_node(env: distenv.DistEnv, environ: Mapping[str, str]) -> str | None:
    """Where srun puts rank 0: the first node of the step (an srun task) or of the job (a batch shell)."""
    if env.launcher not in ("srun", "batch"):
        return None
    names = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST") if env.launcher == "srun" else ("SLURM_JOB_NODELIST",)
    nodes = next((environ[n] for n in names if environ.get(n)), None)
    try:
        return hostlist.expand(nodes)[0] if nodes else None
    except TorchSlurmError:
        return None


def check_placement(facts: Facts) -> Check:
    try:
        env = distenv.detect(facts.environ, free_port=lambda: 0)
    except EnvError as exc:
        return from_error("placement", exc)
    if env.warnings:
        detail, hint = _split_hint(" ".join(env.warnings))
        if env.launcher == "batch":
            hint += " To check every node: srun torchslurm doctor (or torchslurm doctor --ranks)."
        return Check("placement", "warn", detail, hint, env.launcher)
    return Check("placement", "ok", env.reason, value=env.launcher)


def check_torch(facts: Facts) -> Check:
    t = facts.torch
    if t is None:
        return Check("torch", "warn", f"torch is not installed for {facts.python or 'this Python'} "
                     f"({facts.torch_error or 'import failed'}): fine on a login node, but ranks need it.",
                     "install torch in the environment your jobs run (pip install torch).", "")
    cuda = f"CUDA {t.cuda}" if t.cuda else "a CPU-only build (no CUDA)"
    nccl = f"NCCL {t.nccl}" if t.nccl else "no NCCL"
    gloo = "Gloo" if t.gloo else "no Gloo"
    return Check("torch", "ok", f"torch {t.version}, {cuda}, {nccl}, {gloo}; "
                 f"{t.cuda_device_count} CUDA device(s) visible.", value=t.version)


def check_gpus(facts: Facts) -> Check:
    env = placement(facts.environ)
    if env is None:
        return _skipped("gpus")
    if env.launcher == "batch":
        return _batch_gpus(facts.environ)
    allocated = _slurm_gpus(facts.environ)
    if facts.torch is None:
        return Check("gpus", "warn", f"cannot count CUDA devices without torch ({allocated or 'no GPU variables'}).",
                     "run the doctor with the Python your jobs use.")
    count = facts.torch.cuda_device_count
    try:
        choice = devices.choose_device(facts.environ, env.local_rank, env.local_world_size, count)
    except ConfigError as exc:
        return from_error("gpus", exc)
    if choice.kind == "cpu":
        if allocated:
            why = ("torch is a CPU-only build" if facts.torch.cuda is None
                   else "the driver sees none, or CUDA_VISIBLE_DEVICES hides them")
            return Check("gpus", "warn", f"Slurm gave this task GPUs ({allocated}) but torch sees 0 CUDA devices: "
                         f"{why}; training runs on CPU.", "install a CUDA build of torch, and check nvidia-smi on "
                         "this node (srun nvidia-smi).", "cpu")
        return Check("gpus", "ok", f"{choice.reason}; Gloo on CPU.", value="cpu")
    idle = count - env.local_world_size
    if devices.per_task_binding(facts.environ, count) is None and idle > 0:
        return Check("gpus", "warn", f"{env.local_world_size} rank(s) on this node but {count} GPUs visible "
                     f"(CUDA_VISIBLE_DEVICES={facts.environ.get('CUDA_VISIBLE_DEVICES')!r}): {idle} GPU(s) idle; "
                     "one process uses one GPU unless DDP runs one rank per GPU.",
                     _more_ranks_hint(env.launcher, count), choice.name)
    return Check("gpus", "ok", choice.reason, value=choice.name)


def requested_backend(facts: Facts, requested: str | None) -> tuple[str | None, str]:
    """(backend asked for, where it was asked): --backend wins over TORCHSLURM_BACKEND, as in init()."""
    if requested:
        return requested, f"--backend {requested}"
    value = facts.environ.get("TORCHSLURM_BACKEND")
    return (value, f"TORCHSLURM_BACKEND={value}") if value else (None, "")


def check_backend(facts: Facts, requested: str | None = None) -> Check:
    requested, source = requested_backend(facts, requested)
    if requested is not None and requested not in ("gloo", "nccl"):
        return Check("backend", "fail", f"{source} is not a backend torchslurm supports.",
                     "choose gloo or nccl, or leave it unset (NCCL on GPUs, Gloo on CPUs).", requested)
    t = facts.torch
    if t is None:
        return Check("backend", "warn", "cannot tell which backend works without torch.",
                     "run the doctor with the Python your jobs use.", requested or "")
    has_cuda = t.cuda_device_count > 0
    backend = requested or ("nccl" if has_cuda else "gloo")
    if backend == "nccl" and not has_cuda:
        return Check("backend", "fail", f"{source} asks for NCCL but torch sees no CUDA device "
                     f"(torch.cuda.device_count()=0, torch.version.cuda={t.cuda!r}); NCCL only runs on GPUs.",
                     "use gloo on CPU nodes (--backend gloo, backend='gloo', or unset TORCHSLURM_BACKEND), "
                     "or request GPUs from Slurm (--gpus-per-node).", backend)
    if backend == "nccl" and t.nccl is None:
        return Check("backend", "fail", f"backend nccl but torch {t.version} was built without NCCL.",
                     "install a CUDA build of torch with NCCL, or use backend gloo.", backend)
    if backend == "gloo" and not t.gloo:
        return Check("backend", "fail", f"backend gloo but torch {t.version} was built without Gloo.",
                     "install an official torch build.", backend)
    why = source if requested else ("CUDA device visible" if has_cuda else "no CUDA device")
    return Check("backend", "ok", f"{backend} ({why}).", value=backend)


def check_master_addr(facts: Facts) -> Check:
    env = placement(facts.environ)
    if env is None:
        return _skipped("master_addr")
    master = master_name(env, facts.environ)
    nodes = _num_nodes(env, facts.environ)
    if facts.resolve_error:
        return from_error("master_addr", EnvError(facts.resolve_error), value=master)
    if not facts.master_ips:
        return Check("master_addr", "fail", f"MASTER_ADDR={master!r} resolves to no address here.",
                     "use a node name of this job or an IP address.", master)
    shown = f"MASTER_ADDR={master} resolves to {', '.join(facts.master_ips)} on {facts.hostname}"
    first = first_node(env, facts.environ)
    if (first and master != first and facts.first_node_ips and "MASTER_ADDR" in facts.environ
            and not set(facts.master_ips) & set(facts.first_node_ips)):
        return Check("master_addr", "fail", f"{shown}, but rank 0 runs on {first} ({facts.first_node_ips[0]}), the "
                     "first node of this Slurm step: rank 0 starts the store there while the others wait at "
                     f"{master} (a hard-coded MASTER_ADDR).", "remove MASTER_ADDR from the job script; torchslurm "
                     "uses the first node of the step (or: scontrol show hostnames $SLURM_JOB_NODELIST | head -n1).",
                     master)
    loopback = all(ipaddress.ip_address(ip.split("%", 1)[0]).is_loopback for ip in facts.master_ips)
    if loopback and nodes > 1:
        if netif._is_local_name(master) or not _on_master_node(env):
            return Check("master_addr", "fail", f"{shown}, a loopback address, but the job spans {nodes} nodes and "
                         "rank 0 is not on this one: this node's ranks would connect to themselves.",
                         "set MASTER_ADDR to the first node of the job (scontrol show hostnames "
                         "$SLURM_JOB_NODELIST | head -n1), or leave it unset under srun.", master)
        return Check("master_addr", "warn", f"{shown}, a loopback address (a Debian-style '127.0.1.1 <hostname>' "
                     "line in /etc/hosts): plain Gloo binds loopback and the other nodes get 'Connection refused'. "
                     "torchslurm.init() avoids it by setting GLOO_SOCKET_IFNAME to this node's real interface.",
                     "give the node's name its real address in /etc/hosts, or use torchslurm.init() "
                     "(or set GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME per node).", master)
    if facts.source is None:
        return Check("master_addr", "fail", f"{shown}, but this host has no route to it.",
                     "check that MASTER_ADDR names a node of this job.", master)
    return Check("master_addr", "ok", f"{shown}; reached from {facts.source}.", value=master)


def check_master_port(facts: Facts) -> Check:
    env = placement(facts.environ)
    if env is None:
        return _skipped("master_port")
    port = facts.environ.get("MASTER_PORT")
    if port is None:
        if env.job_id is None:
            return Check("master_port", "ok", "MASTER_PORT unset: torchslurm picks a free port at start-up.")
        return Check("master_port", "ok", f"MASTER_PORT unset: torchslurm uses {env.master_port}, derived from "
                     f"job {env.job_id}.", value=str(env.master_port))
    if "TORCHELASTIC_RUN_ID" in facts.environ:
        return Check("master_port", "ok", f"MASTER_PORT={port}, chosen by torchrun.", value=port)
    derived = distenv.derived_port(facts.environ.get("SLURM_JOB_ID", "0"), facts.environ.get("SLURM_STEP_ID"))
    if env.job_id is not None and port.strip() == str(derived):
        return Check("master_port", "ok", f"MASTER_PORT={port}, derived from job {env.job_id} by torchslurm.",
                     value=port)
    if env.job_id is not None:
        return Check("master_port", "warn", f"MASTER_PORT={port} is fixed inside Slurm job {env.job_id}: when two "
                     "jobs share a node, the second job's rank 0 gets 'address in use' and its other ranks join "
                     "the first job's store, breaking both.",
                     f"unset MASTER_PORT; torchslurm derives a job-unique port ({derived} for this step).", port)
    return Check("master_port", "ok", f"MASTER_PORT={port} (fixed; two runs on this machine at once would collide).",
                 value=port)


def check_interfaces(facts: Facts, backend: str | None = None) -> list[Check]:
    """One check per *_SOCKET_IFNAME variable: the user's value exists here, or what torchslurm picks."""
    env = placement(facts.environ)
    if env is None:
        return [_skipped(name.lower()) for name in netif.ENV_NAMES]
    chosen, why = _chosen_interface(facts, env)
    requested = requested_backend(facts, backend)[0]
    uses_nccl = (requested or ("nccl" if facts.torch and facts.torch.cuda_device_count else "gloo")) == "nccl"
    checks = []
    for var in netif.ENV_NAMES:
        name, value = var.lower(), facts.environ.get(var)
        if not value:
            if chosen is None:
                detail, hint = _split_hint(why)
                checks.append(Check(name, "fail", f"{var} unset and torchslurm cannot choose an interface: {detail}",
                                    hint or f"set {var} to the interface of the cluster network on this node "
                                    f"({_names(facts.interfaces)})."))
            else:
                checks.append(Check(name, "ok", f"{var} unset: torchslurm sets it to {chosen} ({why}).", value=chosen))
            continue
        important = var.startswith("GLOO") or uses_nccl
        checks.append(_user_interface(var, value, facts, env, chosen, important))
    return checks


def check_nccl_env(facts: Facts) -> Check:
    """NCCL/torch debug and tuning variables; NCCL_IB_DISABLE=1 on a host with InfiniBand."""
    names = sorted(n for n in facts.environ if n not in netif.ENV_NAMES
                   and (n.startswith(("NCCL_", "TORCH_NCCL_")) or n == "TORCH_DISTRIBUTED_DEBUG"))
    shown = ", ".join(f"{n}={facts.environ[n]}" for n in names)
    if facts.environ.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0") and facts.infiniband:
        return Check("nccl_env", "warn", f"NCCL_IB_DISABLE={facts.environ['NCCL_IB_DISABLE']} but this node has "
                     f"InfiniBand ({', '.join(facts.infiniband)}): NCCL falls back to TCP sockets, many times slower.",
                     "unset NCCL_IB_DISABLE unless a hang was traced to InfiniBand (NCCL_DEBUG=INFO shows it).")
    return Check("nccl_env", "ok", f"set: {shown}." if names else "no NCCL or torch debug variables set "
                 f"({DEBUG_HINT}).")


def check_slurm_commands(facts: Facts) -> Check:
    missing = [c for c in SLURM_COMMANDS if not facts.commands.get(c)]
    found = [c for c in SLURM_COMMANDS if facts.commands.get(c)]
    in_job = "SLURM_JOB_ID" in facts.environ
    srun = facts.commands.get("srun") or ""
    if not in_job and not found:
        return Check("slurm_commands", "ok", "no Slurm client commands on PATH: not a Slurm node "
                     "(torchslurm run starts local ranks).")
    if in_job and "SLURM_STEP_ID" not in facts.environ and not srun:
        return Check("slurm_commands", "fail", f"inside Slurm job {facts.environ['SLURM_JOB_ID']} but srun is not on "
                     f"PATH={facts.environ.get('PATH', '')!r}: the batch script cannot start ranks on other nodes.",
                     "submit with --export=ALL (--export=NONE drops PATH), or call srun by its absolute path.")
    if missing:
        return Check("slurm_commands", "warn", f"{', '.join(missing)} not on PATH={facts.environ.get('PATH', '')!r} "
                     f"(found: {', '.join(found) or 'none'}).",
                     "add Slurm's bin directory to PATH; under srun --export=NONE tasks get no PATH: use "
                     "--export=ALL.", srun)
    return Check("slurm_commands", "ok", f"{', '.join(found)} on PATH ({srun}).", value=srun)


def run_checks(facts: Facts, backend: str | None = None) -> list[Check]:
    """Every check, in the order a user reads them."""
    return [check_placement(facts), check_torch(facts), check_gpus(facts), check_backend(facts, backend),
            check_master_addr(facts), check_master_port(facts), *check_interfaces(facts, backend),
            check_nccl_env(facts), check_slurm_commands(facts)]


def report(facts: Facts, checks: Sequence[Check]) -> Report:
    env = placement(facts.environ)
    return Report(host=facts.hostname, rank=env.rank if env else None, world_size=env.world_size if env else None,
                  launcher=env.launcher if env else None, checks=tuple(checks))


# ---- helpers -------------------------------------------------------------------------------------


def _chosen_interface(facts: Facts, env: distenv.DistEnv) -> tuple[str | None, str]:
    master = master_name(env, facts.environ)
    if facts.resolve_error or not facts.master_ips:
        return None, f"MASTER_ADDR={master!r} does not resolve here (see master_addr)"
    if facts.source is None:
        return None, f"no route to MASTER_ADDR={master!r} ({facts.master_ips[0]})"
    try:
        return netif.choose_interface(master, facts.master_ips, facts.source, facts.interfaces, facts.own_addresses)
    except EnvError as exc:
        return None, str(exc)


def _user_interface(var: str, value: str, facts: Facts, env: distenv.DistEnv, chosen: str | None,
                    important: bool) -> Check:
    """A user-set NCCL/GLOO_SOCKET_IFNAME: every name must exist (and be UP with an address) here."""
    names = sorted({entry.name for entry in facts.interfaces})
    if var.startswith("NCCL") and value.startswith("^"):
        return Check(var.lower(), "ok", f"{var}={value} excludes interfaces; NCCL picks among the rest "
                     f"({', '.join(names)}).", value=value)
    exact = var.startswith("GLOO") or value.startswith("=")
    wanted = [part.strip() for part in value.lstrip("=").split(",") if part.strip()]
    matched = [n for n in names if any(n == w if exact else n.startswith(w) for w in wanted)]
    missing = [w for w in wanted if not any(n == w if exact else n.startswith(w) for n in names)]
    nodes = _num_nodes(env, facts.environ)
    fix = (f"unset {var} (torchslurm picks each node's own interface{': ' + chosen + ' here' if chosen else ''}), "
           f"or set it per node")
    if missing:
        status: Status = "fail" if important else "warn"
        return Check(var.lower(), status, f"{var}={value} but this node ({facts.hostname}) has no UP interface "
                     f"{' or '.join(missing)}; it has: {', '.join(names) or 'none'}. Nodes often name their NICs "
                     "differently (eth0, ens1f0, ...), so one value for every node breaks on some of them"
                     + (" (Gloo: 'Unable to find address for ...')." if var.startswith("GLOO") else "."),
                     fix + ".", value)
    loopback = {entry.name for entry in facts.interfaces if entry.loopback}
    if nodes > 1 and set(matched) <= loopback:
        return Check(var.lower(), "fail" if important else "warn", f"{var}={value} is the loopback interface but the "
                     f"job spans {nodes} nodes: peers on other nodes cannot connect to it.", fix + ".", value)
    if chosen is not None and chosen not in matched:
        return Check(var.lower(), "warn", f"{var}={value} exists here, but the kernel reaches the master through "
                     f"{chosen}.", f"set {var}={chosen} on this node, or unset it.", value)
    route = " and reaches the master" if chosen in matched else ""
    return Check(var.lower(), "ok", f"{var}={value} is set; {', '.join(matched)} is UP on {facts.hostname}{route}.",
                 value=value)


def _batch_gpus(environ: Mapping[str, str]) -> Check:
    """In a batch shell: would `srun python train.py` start one task per allocated GPU?"""
    gpus = gpus_on_node(environ)
    if not gpus:
        return Check("gpus", "ok", "no GPUs in this allocation (SLURM_GPUS_ON_NODE unset).", value="cpu")
    per_node = environ.get("SLURM_TASKS_PER_NODE", "1")
    try:
        tasks = max(hostlist.expand_counts(per_node))
    except TorchSlurmError:
        tasks = 1
    if tasks < gpus:
        return Check("gpus", "warn", f"SLURM_GPUS_ON_NODE={gpus} but SLURM_TASKS_PER_NODE={per_node}: "
                     f"`srun python train.py` starts {tasks} rank(s) per node and {gpus - tasks} GPU(s) stay idle.",
                     f"#SBATCH --ntasks-per-node={gpus} (one task per GPU), or start the ranks with "
                     "`torchslurm run train.py`, which starts one rank per GPU on every node.", str(gpus))
    if tasks > gpus:
        return Check("gpus", "warn", f"SLURM_TASKS_PER_NODE={per_node} but SLURM_GPUS_ON_NODE={gpus}: more ranks "
                     "than GPUs per node; two NCCL ranks on one GPU hang or crash.",
                     f"#SBATCH --ntasks-per-node={gpus}, or request --gpus-per-node={tasks}.", str(gpus))
    return Check("gpus", "ok", f"{gpus} GPU(s) and {tasks} task(s) per node: one rank per GPU.", value=str(gpus))


def _slurm_gpus(environ: Mapping[str, str]) -> str:
    """The GPU variables Slurm set for this process, as 'NAME=value, ...' ('' when none)."""
    names = ("SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")
    shown = [f"{n}={environ[n]}" for n in names if environ.get(n) and environ[n] not in ("0", "-1", "NoDevFiles")]
    return ", ".join(shown) if any(n.startswith("SLURM") for n in shown) else ""


def _more_ranks_hint(launcher: str, gpus: int) -> str:
    return {
        "srun": f"#SBATCH --ntasks-per-node={gpus} (or --gpus-per-task=1), one srun task per GPU.",
        "torchrun": f"torchrun --nproc-per-node={gpus}, one worker per GPU.",
        "local": f"torchslurm run --nproc {gpus} train.py (one rank per GPU).",
    }.get(launcher, f"start {gpus} ranks per node, one per GPU.")


def _num_nodes(env: distenv.DistEnv, environ: Mapping[str, str]) -> int:
    if env.launcher == "batch":
        value = environ.get("SLURM_NNODES", environ.get("SLURM_JOB_NUM_NODES", "1"))
        return int(value) if value.isdigit() else 1
    return env.num_nodes


def _on_master_node(env: distenv.DistEnv) -> bool:
    """Rank 0 runs on node 0 (srun, torchrun), and a batch shell runs on the job's first node."""
    return env.launcher == "batch" or env.node_rank == 0


def _names(table: Sequence[IfAddr]) -> str:
    return ", ".join(sorted({entry.name for entry in table})) or "none"


def _split_hint(message: str) -> tuple[str, str]:
    detail, _, hint = message.partition("HINT:")
    return detail.strip(), hint.strip()


def from_error(name: str, exc: TorchSlurmError, value: str = "") -> Check:
    """A failed check from a runtime error: its message up to HINT: as the detail, the rest as the hint."""
    detail, hint = _split_hint(str(exc))
    return Check(name, "fail", detail, hint, value)


def _skipped(name: str) -> Check:
    return Check(name, "warn", "not checked: the placement is inconsistent (see placement).",
                 "fix the placement failure first.")
