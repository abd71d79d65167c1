"""Finding + validate(spec): job specs that are legal but likely wrong, each with a HINT.

`JobSpec` (spec.py) already refused what can never work; here are the combinations that Slurm
would accept and the job would then get wrong (ntasks vs GPUs mismatches, a grace time longer
than the time limit), plus the effective batch size summary. `lint` reports its findings about
hand-written scripts with the same `Finding`. Pure: the Slurm version is passed in as data.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from torchslurm import hostlist
from torchslurm.errors import render, shown
from torchslurm.jobs.interpreter import container_without_gpus, with_gpus
from torchslurm.jobs.slurmoutput import NodeInfo
from torchslurm.jobs.slurmvalues import TIME_PATTERN, parse_slurm_version, parse_time
from torchslurm.jobs.spec import JobSpec
from torchslurm.jobs.spelling import SPEC_FILE, Spelling
from torchslurm.severity import SEVERITIES as SEVERITIES  # re-exported: lint names them from here
from torchslurm.severity import Severity as Severity

# `--gpus-per-node` arrived with cons_tres in Slurm 19.05; older versions only know `--gres=gpu:N`.
GPUS_PER_NODE_SINCE = (19, 5)


@dataclass(frozen=True)
class Finding:
    """One problem (or summary) about a job: what, why, and the fix."""

    severity: Severity
    code: str
    message: str
    hint: str

    def __str__(self) -> str:
        return f"{self.severity}: [{self.code}] {render(self.message, self.hint)}"


def log_dir_missing(option: str, value: str, folder: str) -> Finding:
    """[log-dir]: the folder of `--option=value` may not exist, and Slurm does not create it (sbatch(1),
    --output): the job then fails before printing anything. Said by `lint` and by `script`."""
    return Finding("warning", "log-dir", f"--{option}={value}: Slurm does not create {folder}/; if it is missing "
                   "the job fails before printing anything.", f"mkdir -p {shlex.quote(folder)} before sbatch.")


def by_severity(findings: Iterable[Finding]) -> list[Finding]:
    """Errors first, then warnings, then notes; in the order found within each."""
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


def validate(spec: JobSpec, slurm_version: str | tuple[int, int] | None = None,
             spelling: Spelling = SPEC_FILE) -> list[Finding]:
    """Every likely mistake in `spec`, errors first, its fields named as `spelling` names them.
    Pure: the Slurm version is passed in as data."""
    version = parse_slurm_version(slurm_version) if isinstance(slurm_version, str) else slurm_version
    return by_severity([*_check_layout(spec, spelling), *_check_backend(spec, spelling),
                        *_check_preemption(spec, spelling), *_check_gpu_flag(spec, version, spelling),
                        *_check_time(spec, spelling), *_check_container(spec, spelling),
                        *_summaries(spec, spelling)])


def _check_layout(spec: JobSpec, sp: Spelling) -> list[Finding]:
    out: list[Finding] = []
    g, tasks = spec.gpus_per_node, spec.slurm_tasks_per_node
    if spec.launch == "srun" and g > 0 and tasks != g:
        out.append(Finding(
            "error", "tasks-vs-gpus",
            f"{sp.given('launch', 'srun')} runs one rank per Slurm task, but {sp.given('tasks_per_node', tasks)} "
            f"and {sp.given('gpus_per_node', g)}.",
            f"set {sp.setting('tasks_per_node', g)}, or use {sp.setting('launch', 'torchrun')} with "
            f"{sp.setting('tasks_per_node', 1)}."))
    if spec.launch == "torchrun" and tasks != 1:
        out.append(Finding(
            "error", "torchrun-tasks",
            f"{sp.given('launch', 'torchrun')} with {sp.given('tasks_per_node', tasks)}: every task would start its "
            "own torchrun agent and the ranks would be counted several times.",
            f"set {sp.setting('tasks_per_node', 1)} (torchrun starts {sp.name('nproc_per_node')} workers itself)."))
    if spec.launch == "torchrun" and g > 0 and spec.ranks_per_node != g:
        out.append(Finding(
            "error", "nproc-vs-gpus",
            f"{sp.given('launch', 'torchrun')} with {sp.given('nproc_per_node', spec.ranks_per_node)} but "
            f"{sp.given('gpus_per_node', g)}.",
            f"set {sp.setting('nproc_per_node', g)} (one worker per GPU)."))
    if spec.launch == "torchrun" and spec.ranks_per_node > 1 and spec.cpus_per_task is None:
        out.append(Finding(
            "warning", "torchrun-cpus",
            f"{sp.given('launch', 'torchrun')} runs {spec.ranks_per_node} workers inside one Slurm task, which gets "
            f"1 CPU unless {sp.name('cpus_per_task')} is set.",
            f"set {sp.setting('cpus_per_task', spec.ranks_per_node)} (or more, for data loading workers)."))
    return out


def _check_backend(spec: JobSpec, sp: Spelling) -> list[Finding]:
    out: list[Finding] = []
    if spec.gpus_per_node == 0 and spec.backend == "nccl":
        out.append(Finding("error", "nccl-without-gpu",
                           f"{sp.given('backend', 'nccl')} but {sp.given('gpus_per_node', 0)}: NCCL needs CUDA GPUs.",
                           f"use {sp.setting('backend', 'gloo')} (or auto) for a CPU job, or request GPUs with "
                           f"{sp.name('gpus_per_node')}."))
    if spec.gpus_per_node > 0 and spec.backend == "gloo":
        out.append(Finding("warning", "gloo-with-gpu",
                           f"{sp.given('backend', 'gloo')} with {sp.given('gpus_per_node', spec.gpus_per_node)}: "
                           "gradients go through CPU memory, much slower than NCCL.",
                           f"use {sp.setting('backend', 'auto')} (NCCL on GPUs)."))
    if spec.nic is not None:
        out.append(Finding("warning", "nic-override",
                           f"{sp.name('nic')}={spec.nic!r} sets the same interface name on every node; nodes with "
                           "other NIC names fail with `Unable to find address for`.",
                           f"leave {sp.name('nic')} unset: torchslurm picks the interface reaching the master per "
                           "node."))
    return out


def _check_preemption(spec: JobSpec, sp: Spelling) -> list[Finding]:
    if not spec.preemptible:
        return []
    out: list[Finding] = []
    limit = spec.time_s
    if limit is not None and limit > 0 and spec.grace_s >= limit:
        out.append(Finding("error", "grace-vs-time",
                           f"{sp.given('grace_s', spec.grace_s)} is not shorter than {sp.name('time')}={spec.time!r} "
                           f"({limit} s): the warning signal would come before the job starts working.",
                           f"set {sp.name('grace_s')} below {limit} (e.g. {max(limit // 10, 1)}), or a longer "
                           f"{sp.name('time')}."))
    if limit is None:
        out.append(Finding("warning", "signal-without-time",
                           "preemptible without a time limit: Slurm sends the warning signal only before "
                           "the time limit, so only scancel/preemption will stop the job cleanly.",
                           f"set {sp.name('time')} (e.g. {sp.setting('time', '4:00:00')})."))
    if not spec.requeue:
        out.append(Finding("warning", "no-requeue",
                           f"preemptible with {sp.given('requeue', False)}: after the checkpoint the job ends "
                           "instead of continuing.", f"set {sp.setting('requeue', True)}."))
    if spec.grace_s < 60:
        out.append(Finding("warning", "short-grace",
                           f"{sp.given('grace_s', spec.grace_s)}: Slurm's signal timer has a 60 s resolution, and "
                           "the checkpoint must fit in the remaining time.",
                           f"set {sp.name('grace_s')} to 60 or more."))
    return out


def _check_gpu_flag(spec: JobSpec, version: tuple[int, int] | None, sp: Spelling) -> list[Finding]:
    if spec.gpus_per_node == 0 or version is None:
        return []
    vtext = f"{version[0]}.{version[1]:02d}"
    if spec.gpu_flag == "gpus-per-node" and version < GPUS_PER_NODE_SINCE:
        return [Finding("error", "gpu-flag",
                        f"{sp.given('gpu_flag', 'gpus-per-node')} but Slurm {vtext} predates --gpus-per-node "
                        "(19.05).", f"set {sp.setting('gpu_flag', 'gres')} (renders --gres=gpu:N).")]
    if spec.gpu_flag == "gres" and version >= GPUS_PER_NODE_SINCE:
        return [Finding("info", "gpu-flag",
                        f"{sp.given('gpu_flag', 'gres')} on Slurm {vtext}: --gres=gpu:N works, --gpus-per-node "
                        "also does and sets SLURM_GPUS_PER_NODE.",
                        f"keep it, or set {sp.setting('gpu_flag', 'gpus-per-node')}.")]
    return []


def _check_time(spec: JobSpec, sp: Spelling) -> list[Finding]:
    """[time-read-as]: a time limit Slurm reads other than it looks (docs/slurm.md, time limits):
    `0` is no limit at all, and a field past its range carries over (`99:99` is M:S, 100 min 39 s,
    which Slurm rounds up to whole minutes: 1:41:00)."""
    if spec.time is None:
        return []
    seconds = parse_time(spec.time)
    if seconds == 0:
        return [Finding("info", "time-read-as", f"{sp.given('time', spec.time)} means no time limit: Slurm reads "
                        "0 as UNLIMITED (the partition's MaxTime still applies).",
                        f"give the limit you mean, e.g. {sp.setting('time', '4:00:00')}")]
    match = TIME_PATTERN.fullmatch(spec.time.strip())
    assert match is not None  # JobSpec refused any other time
    days, *fields = match.groups()
    numbers = [int(x) for x in fields if x is not None]
    # the upper bound of each number as written: D-H[:M[:S]], or [[H:]M:]S with the first one open
    limits = [24, 60, 60] if days is not None else [0, 60, 60][:len(numbers)]
    if not any(0 < limit <= n for n, limit in zip(numbers, limits, strict=False)):
        return []
    minutes = -(-seconds // 60)  # Slurm rounds a limit up to whole minutes
    read = f"{minutes // 1440}-{minutes // 60 % 24:02d}:{minutes % 60:02d}:00" if minutes >= 1440 \
        else f"{minutes // 60}:{minutes % 60:02d}:00"
    form = "days-hours:minutes:seconds" if days is not None else {2: "minutes:seconds"}.get(len(numbers),
                                                                                         "hours:minutes:seconds")
    return [Finding("info", "time-read-as", f"{sp.given('time', spec.time)} is read as {form}, with the overflow "
                    f"carried: a limit of {read}.", f"write {sp.setting('time', read)} if that is what you mean")]


def _check_container(spec: JobSpec, sp: Spelling) -> list[Finding]:
    runtime = container_without_gpus(spec.python, spec.env) if spec.gpus_per_node else None
    if runtime is None:
        return []
    return [Finding("warning", "container-without-gpus",
                    f"{sp.name('python')}={shown(spec.python)} runs Python in {runtime} without --nv: on NVIDIA GPUs "
                    f"the container sees none of the {spec.gpus_per_node} per node, so the ranks would find no CUDA "
                    "device (AMD GPUs need no flag).",
                    f"add --nv: {sp.setting('python', with_gpus(spec.python))} (or set APPTAINER_NV=1 in env); on "
                    "AMD GPUs, --rocm or nothing")]


def _summaries(spec: JobSpec, sp: Spelling) -> list[Finding]:
    if spec.batch_size is None:
        return []
    world = spec.world_size
    text = (f"effective batch size = {spec.batch_size} per rank x {world} ranks = {spec.batch_size * world}"
            f" ({spec.nodes} node(s) x {spec.ranks_per_node} rank(s))")
    hint = "gradients are averaged over all ranks, so each step sees the effective batch."
    if spec.lr is not None:
        text += f"; {sp.given('lr', f'{spec.lr:g}')} was tuned for which batch size?"
        hint = (f"linear scaling from a single rank gives {sp.given('lr', f'{spec.lr * world:g}')} "
                f"(square-root scaling: {spec.lr * world ** 0.5:g}); warm up when scaling by a lot.")
    return [Finding("info", "effective-batch", text if text.endswith("?") else text + ".", hint)]


_MEM_UNITS_KB = {"K": 1, "M": 1024, "G": 1024 ** 2, "T": 1024 ** 3}


def _memory_kb(mem: str | None) -> int:
    """`--mem` (digits and an optional unit, as JobSpec takes it) in KB, as sbatch reads it (no unit: MB);
    0 (all of a node's memory) or none: 0."""
    if mem is None:
        return 0
    number, unit = (mem[:-1], mem[-1]) if mem[-1] in _MEM_UNITS_KB else (mem, "M")
    return int(number) * _MEM_UNITS_KB[unit]


def capacity(spec: JobSpec, nodes: list[NodeInfo], sp: Spelling = SPEC_FILE) -> list[Finding]:
    """[never-starts]: the job asks more of each node than `nodes` (the partition's, from sinfo) have,
    or more nodes than fit, or a node of its nodelist cannot hold it. Slurm accepts such a job and it
    pends for ever (Reason=PartitionConfig, or Resources), so `submit` refuses it. A nodelist names
    nodes the job must have, not the only ones it may get (sbatch(1), --nodelist: "possibly additional
    hosts as needed"). Pure: the nodes are data."""
    where = f"partition {spec.partition}" if spec.partition else "the default partition"
    if not nodes:
        return [Finding("error", "never-starts", f"{sp.given('partition', spec.partition)}: Slurm has no such "
                        "partition.", "`sinfo -s` lists the partitions; give one of those")] if spec.partition else []
    if spec.exclude:
        excluded = set(hostlist.expand(spec.exclude))
        nodes = [n for n in nodes if n.name not in excluded]
    cpus = spec.slurm_tasks_per_node * (spec.cpus_per_task or 1)
    memory = _memory_kb(spec.mem)
    fit = [n for n in nodes if n.gpus >= spec.gpus_per_node and n.cpus >= cpus and n.memory_mb * 1024 >= memory]
    listed = set(hostlist.expand(spec.nodelist)) if spec.nodelist else set()
    unfit = hostlist.compress(n.name for n in nodes if n.name in listed and n not in fit)
    if len(fit) >= spec.nodes and not unfit:
        return []
    asked = [f"{cpus} CPUs ({spec.slurm_tasks_per_node} task(s) x {spec.cpus_per_task or 1})"]
    if spec.gpus_per_node:
        asked.append(f"{spec.gpus_per_node} GPUs")
    if memory:
        asked.append(f"{spec.mem} memory")
    short = [f"only {len(fit)} node(s) of {where} have that"] if len(fit) < spec.nodes else []
    if unfit:
        short.append(f"{unfit} of its {sp.name('nodelist')} do(es) not")
    kinds = sorted({(n.cpus, n.gpus, n.memory_mb) for n in nodes}, reverse=True)
    have = "; ".join(f"{hostlist.compress(n.name for n in nodes if (n.cpus, n.gpus, n.memory_mb) == k)}: "
                     f"{k[0]} CPUs, {k[1]} GPUs, {k[2]} MB" for k in kinds) or f"{sp.name('exclude')} leaves none"
    return [Finding("error", "never-starts",
                    f"the job asks for {spec.nodes} node(s) with {', '.join(asked)} each, but {' and '.join(short)} "
                    f"({have}); Slurm would queue it and it would never start.",
                    f"ask for {_what_fits(spec, nodes, fit, cpus, unfit, sp)}, or another partition "
                    "(`sinfo -N -l` shows what each node has)")]


def _what_fits(spec: JobSpec, nodes: list[NodeInfo], fit: list[NodeInfo], cpus: int, unfit: str,
               sp: Spelling) -> str:
    """What the job could ask for instead: what the best node has, a nodelist without the nodes that cannot
    hold it, or no more nodes than fit."""
    best = max(nodes, key=lambda n: (n.gpus, n.cpus), default=None)
    if best is None:
        return f"fewer nodes in {sp.name('exclude')}"
    if spec.gpus_per_node > best.gpus:
        return f"{sp.setting('gpus_per_node', best.gpus)} (with as many tasks per node in srun mode)"
    if cpus > best.cpus:
        return f"{sp.name('cpus_per_task')} x tasks per node <= {best.cpus}"
    if unfit:
        return f"a {sp.name('nodelist')} without {unfit}"
    return f"at most {len(fit)} node(s)" if len(fit) == len(nodes) else "what a node has"
