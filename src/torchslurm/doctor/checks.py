"""`torchslurm doctor`'s checks: the usual causes of a hung or failed distributed start, as pure functions.

Each check is a pure function of recorded `Facts` (the environ mapping, this host's interfaces,
what MASTER_ADDR resolves to, torch's versions, which Slurm commands are on PATH) and returns a
`Check(name, status, detail, hint)`; `run_checks` runs them all and `report` gathers them into a
`Report`. Their types live in torchslurm.doctor.facts, the network checks in torchslurm.doctor.netcheck. No
effects here: torchslurm.doctor.probe records the facts (`gather`) and tries a real process group
(`check_connect`); rendering lives in the CLI (torchslurm.cli.doctor), the only place that prints.

The placement, device and NIC decisions are the runtime's own (distenv, devices, netif): the
doctor reports what `torchslurm.init()` would do here and why, and what would break.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from torchslurm import hostlist
from torchslurm.doctor.facts import (
    Check,
    Facts,
    Report,
    TorchFacts,
    from_error,
    placement,
    requested_backend,
    skipped,
)
from torchslurm.doctor.netcheck import check_interfaces, check_master_addr, check_master_port
from torchslurm.errors import ConfigError, EnvError, TorchSlurmError
from torchslurm.jobs.slurmoutput import failure_hint
from torchslurm.runtime import devices, distenv, netif
from torchslurm.runtime.launch import gpus_on_node

__all__ = ["Check", "Facts", "Report", "TorchFacts", "check_interfaces", "check_master_addr", "check_master_port",
           "missing_ranks", "report", "run_checks"]

SLURM_COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
_CONTROLLER_STATE = re.compile(r"Slurmctld\((\w+)\) at (\S+) is (\w+)")
DEBUG_HINT = "for a hang, rerun with NCCL_DEBUG=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL to see where it stops"


def check_placement(facts: Facts) -> Check:
    try:
        env = distenv.detect(facts.environ, free_port=lambda: 0)
    except EnvError as exc:
        return from_error("placement", exc)
    if env.warnings:
        detail = " ".join(warning.message for warning in env.warnings)
        hint = " ".join(warning.hint for warning in env.warnings if warning.hint)
        if env.launcher == "batch":
            hint += " To check every node: srun torchslurm doctor (or torchslurm doctor --ranks)."
        return Check("placement", "warning", detail, hint, env.launcher)
    return Check("placement", "ok", env.reason, value=env.launcher)


def check_torch(facts: Facts) -> Check:
    t = facts.torch
    if t is None:
        return Check("torch", "warning", f"torch is not installed for {facts.python or 'this Python'} "
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
        return skipped("gpus")
    unseen = None if facts.torch is None else devices.gpus_unseen(facts.environ, facts.torch.cuda_device_count,
                                                                  facts.torch.cuda)
    if env.launcher == "batch":
        return _with_unseen(_batch_gpus(facts.environ), unseen)
    if unseen is not None:
        return Check("gpus", "warning", unseen.message, unseen.hint or "", "cpu")
    allocated = devices.slurm_gpus(facts.environ)
    if facts.torch is None:
        return Check("gpus", "warning", f"cannot count CUDA devices without torch ({allocated or 'no GPU variables'}).",
                     "run the doctor with the Python your jobs use.")
    count = facts.torch.cuda_device_count
    try:
        choice = devices.choose_device(facts.environ, env.local_rank, env.gpu_sharers, count)
    except ConfigError as exc:
        return from_error("gpus", exc)
    if choice.kind == "cpu":
        return Check("gpus", "ok", f"{choice.reason}; Gloo on CPU.", value="cpu")
    idle = count - env.local_world_size
    if env.local_world_known and devices.per_task_binding(facts.environ, count) is None and idle > 0:
        return Check("gpus", "warning", f"{env.local_world_size} rank(s) on this node but {count} GPUs visible "
                     f"(CUDA_VISIBLE_DEVICES={facts.environ.get('CUDA_VISIBLE_DEVICES')!r}): {idle} GPU(s) idle; "
                     "one process uses one GPU unless DDP runs one rank per GPU.",
                     _more_ranks_hint(env.launcher, count), choice.name)
    return Check("gpus", "ok", choice.reason, value=choice.name)


def check_cpus(facts: Facts) -> Check:
    """Each rank's CPUs: what srun passes on of --cpus-per-task, and ranks against the node's CPUs."""
    env = placement(facts.environ)
    if env is None:
        return skipped("cpus")
    problems: list[TorchSlurmError | None] = [devices.srun_cpus_unset(facts.environ)]
    if facts.usable_cpus:
        problems += [devices.cpus_per_task_lost(facts.environ, facts.usable_cpus),
                     devices.cpu_oversubscription(facts.environ, env.gpu_sharers, facts.usable_cpus)]
    problem = next((p for p in problems if p is not None), None)
    if problem is not None:
        return Check("cpus", "warning", problem.message, problem.hint or "", str(facts.usable_cpus or ""))
    seen = f"{facts.usable_cpus} CPU(s) usable here" if facts.usable_cpus else "CPUs not counted"
    return Check("cpus", "ok", f"{seen}; {env.gpu_sharers} rank(s) on this node.", value=str(facts.usable_cpus or ""))


def check_backend(facts: Facts, requested: str | None = None) -> Check:
    requested, source = requested_backend(facts, requested)
    if requested is not None and requested not in devices.BACKENDS:
        return Check("backend", "error", f"{source} is not a backend torchslurm supports.",
                     "choose gloo or nccl, or leave it unset (NCCL on GPUs, Gloo on CPUs).", requested)
    t = facts.torch
    if t is None:
        return Check("backend", "warning", "cannot tell which backend works without torch.",
                     "run the doctor with the Python your jobs use.", requested or "")
    has_cuda = t.cuda_device_count > 0
    backend = requested or ("nccl" if has_cuda else "gloo")
    if backend == "nccl" and not has_cuda:
        return Check("backend", "error", f"{source} asks for NCCL but torch sees no CUDA device "
                     f"(torch.cuda.device_count()=0, torch.version.cuda={t.cuda!r}); NCCL only runs on GPUs.",
                     "use gloo on CPU nodes (--backend gloo, backend='gloo', or unset TORCHSLURM_BACKEND), "
                     "or request GPUs from Slurm (--gpus-per-node).", backend)
    if backend == "nccl" and t.nccl is None:
        return Check("backend", "error", f"backend nccl but torch {t.version} was built without NCCL.",
                     "install a CUDA build of torch with NCCL, or use backend gloo.", backend)
    if backend == "gloo" and not t.gloo:
        return Check("backend", "error", f"backend gloo but torch {t.version} was built without Gloo.",
                     "install an official torch build.", backend)
    why = source if requested else ("CUDA device visible" if has_cuda else "no CUDA device")
    return Check("backend", "ok", f"{backend} ({why}).", value=backend)


def check_nccl_env(facts: Facts) -> Check:
    """NCCL/torch debug and tuning variables; NCCL_IB_DISABLE=1 on a host with InfiniBand."""
    names = sorted(n for n in facts.environ if n not in netif.ENV_NAMES
                   and (n.startswith(("NCCL_", "TORCH_NCCL_")) or n == "TORCH_DISTRIBUTED_DEBUG"))
    shown = ", ".join(f"{n}={facts.environ[n]}" for n in names)
    if facts.environ.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0") and facts.infiniband:
        return Check("nccl_env", "warning", f"NCCL_IB_DISABLE={facts.environ['NCCL_IB_DISABLE']} but this node has "
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
        return Check("slurm_commands", "error", f"inside Slurm job {facts.environ['SLURM_JOB_ID']} but srun is not on "
                     f"PATH={facts.environ.get('PATH', '')!r}: the batch script cannot start ranks on other nodes.",
                     "submit with --export=ALL (--export=NONE drops PATH), or call srun by its absolute path.")
    if missing:
        return Check("slurm_commands", "warning", f"{', '.join(missing)} not on PATH={facts.environ.get('PATH', '')!r} "
                     f"(found: {', '.join(found) or 'none'}).",
                     "add Slurm's bin directory to PATH; under srun --export=NONE tasks get no PATH: use "
                     "--export=ALL.", srun)
    return Check("slurm_commands", "ok", f"{', '.join(found)} on PATH ({srun}).", value=srun)


def check_controller(facts: Facts) -> Check:
    """Does slurmctld answer `scontrol ping` from here? Without it sbatch fails, and inside a job
    srun cannot start steps and a requeue after preemption is lost."""
    if facts.controller is None:
        why = "each node's first rank asks" if facts.commands.get("scontrol") else "scontrol is not on PATH"
        return Check("slurm_controller", "ok", f"not asked ({why}).")
    code, output = facts.controller
    states = _CONTROLLER_STATE.findall(output)
    up = [f"{host} ({role})" for role, host, state in states if state == "UP"]
    if code == 0 and up:
        return Check("slurm_controller", "ok", f"slurmctld answers at {', '.join(up)}.", value=up[0].split()[0])
    seen = "; ".join(f"{host} ({role}) is {state}" for role, host, state in states) or _last_error(output)
    in_job = "SLURM_JOB_ID" in facts.environ
    effect = ("srun cannot start job steps and a requeue after preemption fails" if in_job
              else "sbatch and `torchslurm submit` fail here; `torchslurm run` on this machine still works")
    hint = (failure_hint(output) if not states else
            "check that slurmctld runs on that host (`systemctl status slurmctld` there, or ask your admins) and that "
            "this node reaches its SlurmctldPort; with no cluster, `torchslurm sandbox up` starts a local one.")
    return Check("slurm_controller", "error" if in_job else "warning",
                 f"`scontrol ping` (exit {code}): {seen}: {effect}.", hint)


def check_excluded_nodes(facts: Facts) -> list[Check]:
    """Which nodes the job may not use (ExcNodeList): its --exclude, and the nodes a node-level failure
    took out of a requeued attempt (train.badnodes). Nothing when not asked."""
    if facts.excluded_nodes is None:
        return []
    job = facts.environ.get("SLURM_JOB_ID", "?")
    if not facts.excluded_nodes:
        return [Check("excluded_nodes", "ok", f"job {job} excludes no node.")]
    return [Check("excluded_nodes", "info", f"job {job} excludes {facts.excluded_nodes} (ExcNodeList): its "
                  "--exclude, or nodes a node-level failure of an earlier attempt took out (its log says which "
                  "and why).", "`scontrol update JobId=JOB ExcNodeList=...` while it pends changes the list.",
                  facts.excluded_nodes)]


def run_checks(facts: Facts, backend: str | None = None) -> list[Check]:
    """Every check, in the order a user reads them."""
    return [check_placement(facts), check_torch(facts), check_gpus(facts), check_cpus(facts),
            check_backend(facts, backend),
            check_master_addr(facts), check_master_port(facts), *check_interfaces(facts, backend),
            check_nccl_env(facts), check_slurm_commands(facts), check_controller(facts),
            *check_excluded_nodes(facts)]


def report(facts: Facts, checks: Sequence[Check]) -> Report:
    env = placement(facts.environ)
    return Report(host=facts.hostname, rank=env.rank if env else None, world_size=env.world_size if env else None,
                  launcher=env.launcher if env else None, checks=tuple(checks))


def missing_ranks(reports: Sequence[Report]) -> list[int]:
    """Ranks that should have reported (0 … world_size-1 of the largest world seen) but did not;
    none when no report knows its placement."""
    expected = max((r.world_size for r in reports if r.world_size is not None), default=0)
    return sorted(set(range(expected)) - {r.rank for r in reports if r.rank is not None})


# ---- helpers -------------------------------------------------------------------------------------


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
        return Check("gpus", "warning", f"SLURM_GPUS_ON_NODE={gpus} but SLURM_TASKS_PER_NODE={per_node}: "
                     f"`srun python train.py` starts {tasks} rank(s) per node and {gpus - tasks} GPU(s) stay idle.",
                     f"#SBATCH --ntasks-per-node={gpus} (one task per GPU), or start the ranks with "
                     "`torchslurm run train.py`, which starts one rank per GPU on every node.", str(gpus))
    if tasks > gpus:
        return Check("gpus", "warning", f"SLURM_TASKS_PER_NODE={per_node} but SLURM_GPUS_ON_NODE={gpus}: more ranks "
                     "than GPUs per node; two NCCL ranks on one GPU hang or crash.",
                     f"#SBATCH --ntasks-per-node={gpus}, or request --gpus-per-node={tasks}.", str(gpus))
    return Check("gpus", "ok", f"{gpus} GPU(s) and {tasks} task(s) per node: one rank per GPU.", value=str(gpus))


def _with_unseen(check: Check, unseen: EnvError | None) -> Check:
    """The batch shell's GPU check, led by Slurm GPUs that torch does not see (init() warns of them too)."""
    if unseen is None:
        return check
    if check.status == "ok":
        return Check("gpus", "warning", unseen.message, unseen.hint or "", "cpu")
    return Check("gpus", "warning", f"{unseen.message} Also: {check.detail}", f"{unseen.hint} {check.hint}",
                 check.value)


def _last_error(output: str) -> str:
    """The last 'error:'/'fatal:' line of a Slurm client's output, without its 'scontrol: ' prefix."""
    lines = [line for line in output.splitlines() if "error:" in line or "fatal:" in line]
    last = lines[-1] if lines else (output.strip().splitlines() or ["no output"])[-1]
    return last.split(": ", 1)[-1].strip()


def _more_ranks_hint(launcher: str, gpus: int) -> str:
    return {
        "srun": f"#SBATCH --ntasks-per-node={gpus} (or --gpus-per-task=1), one srun task per GPU.",
        "torchrun": f"torchrun --nproc-per-node={gpus}, one worker per GPU.",
        "local": f"torchslurm run --nproc {gpus} train.py (one rank per GPU).",
    }.get(launcher, f"start {gpus} ranks per node, one per GPU.")
