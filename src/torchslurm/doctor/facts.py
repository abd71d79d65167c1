"""What `torchslurm doctor` reads and says: the recorded `Facts`, one `Check` per finding, a `Report`
per process (as JSON and as text), and the placement helpers every check shares. Pure:
torchslurm.doctor.probe records the facts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from torchslurm import hostlist
from torchslurm.errors import EnvError, TorchSlurmError
from torchslurm.runtime import distenv
from torchslurm.runtime.netif import IfAddr
from torchslurm.runtime.variables import is_digits
from torchslurm.severity import Status as Status  # re-exported: the checks name it from here

WORDS: dict[Status, str] = {"ok": "ok", "info": "info", "warning": "warn", "error": "fail"}
"""How the doctor spells a check's status in its JSON (`doctor --json`, and the report a rank sends
to `doctor --ranks`): the words it has always printed; upper-cased they mark the lines of its text."""
_STATUS_OF_WORD = {word: status for status, word in WORDS.items()}
_MARKS = {**{status: word.upper() for status, word in WORDS.items()}, "ok": "ok  "}
"""The mark of a line of the text report: `ok  `, `WARN`, `FAIL`."""


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
    """Everything the checks look at, recorded once by `torchslurm.doctor.probe.gather()` (tests build it by hand)."""

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
    resolve_error: EnvError | None = None
    """Why the master's name does not resolve here (netif.resolve's error); None when it does."""
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
    controller: tuple[int, str] | None = None
    """`scontrol ping`'s exit code and output (stdout, then stderr); None when not asked (no
    scontrol on PATH, or not the first rank of its node: one ping per node)."""
    excluded_nodes: str | None = None
    """The job's ExcNodeList ('' when none: `scontrol show job`); None when not asked (outside a job,
    not the first rank of its node, or Slurm did not answer)."""
    python: str = ""
    """sys.executable."""
    usable_cpus: int = 0
    """CPUs this process may run on (its affinity); 0 when not recorded."""


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
        return any(check.status == "error" for check in self.checks)

    def to_json(self) -> dict[str, Any]:
        checks = [{**asdict(check), "status": WORDS[check.status]} for check in self.checks]
        return {"host": self.host, "rank": self.rank, "world_size": self.world_size, "launcher": self.launcher,
                "ok": not self.failed, "checks": checks}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Report:
        """The inverse of `to_json` (a rank's line read back by `doctor --ranks`); KeyError/TypeError if not one."""
        checks = tuple(Check(c["name"], _STATUS_OF_WORD[c["status"]], c["detail"], c.get("hint", ""),
                             c.get("value", "")) for c in data["checks"])
        return cls(str(data["host"]), data["rank"], data["world_size"], data["launcher"], checks)


def render(result: Report) -> str:
    """The report as text; every line prefixed with host/rank when several ranks print at once."""
    prefix = f"{result.host}/{result.rank}: " if (result.world_size or 1) > 1 else ""
    where = (f"rank {result.rank} of {result.world_size}, {result.launcher}" if result.rank is not None
             else "placement unknown")
    lines = [f"torchslurm doctor on {result.host} ({where})"]
    width = max(len(check.name) for check in result.checks)
    for check in result.checks:
        lines.append(f"  {_MARKS[check.status]}  {check.name:<{width}}  {check.detail}")
        if check.hint:
            lines.append(f"        {'':<{width}}  HINT: {check.hint}")
    counts = {status: sum(c.status == status for c in result.checks) for status in ("ok", "warning", "error")}
    lines.append(f"{counts['ok']} ok, {counts['warning']} warning(s), {counts['error']} failure(s)")
    return "\n".join(prefix + line for line in lines) + "\n"


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
    """Where the store runs without MASTER_ADDR: the first node of the step (an srun task) or of the job
    (a batch shell)."""
    nodes = slurm_nodes(env, environ)
    return nodes[0] if nodes else None


def slurm_nodes(env: distenv.DistEnv, environ: Mapping[str, str]) -> list[str]:
    """The nodes of the step (an srun task) or of the job (a batch shell); [] outside Slurm."""
    if env.launcher not in ("srun", "batch"):
        return []
    names = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST") if env.launcher == "srun" else ("SLURM_JOB_NODELIST",)
    nodes = next((environ[n] for n in names if environ.get(n)), None)
    try:
        return hostlist.expand(nodes) if nodes else []
    except TorchSlurmError:
        return []


def num_nodes(env: distenv.DistEnv, environ: Mapping[str, str]) -> int:
    if env.launcher == "batch":
        value = environ.get("SLURM_NNODES", environ.get("SLURM_JOB_NUM_NODES", "1"))
        return int(value) if is_digits(value) else 1
    return env.num_nodes


def requested_backend(facts: Facts, requested: str | None) -> tuple[str | None, str]:
    """(backend asked for, where it was asked): --backend wins over TORCHSLURM_BACKEND, as in init()."""
    if requested:
        return requested, f"--backend {requested}"
    value = facts.environ.get("TORCHSLURM_BACKEND")
    return (value, f"TORCHSLURM_BACKEND={value}") if value else (None, "")


def from_error(name: str, exc: TorchSlurmError, value: str = "") -> Check:
    """A failed check from a runtime error: its message as the detail, its hint as the hint."""
    return Check(name, "error", exc.message, exc.hint or "", value)


def skipped(name: str) -> Check:
    return Check(name, "warning", "not checked: the placement is inconsistent (see placement).",
                 "fix the placement failure first.")
