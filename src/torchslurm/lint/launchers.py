"""lint checks of deepspeed and `accelerate launch` lines, and of per-task variables that the batch
shell expanded into a launch line.

deepspeed and accelerate are modelled like torchrun: how many nodes they span (`--num_nodes`,
`--num_machines`), how many processes (`--num_gpus`, `--num_processes`: all machines together for
accelerate), the machine rank and the main process address. Pure, nothing executed.
"""

from __future__ import annotations

from torchslurm.jobs.findings import Finding
from torchslurm.lint.launch import gpus_per_node, leading_int, step_nodes
from torchslurm.lint.parse import Launch, Script
from torchslurm.lint.shell import batch_expanded, shown

__all__ = ["check_batch_expanded", "check_deepspeed_accelerate"]

_NODES_OPTION = {"deepspeed": "num-nodes", "accelerate": "num-machines"}
_RANK_OPTIONS = ("node-rank", "machine-rank")


def check_deepspeed_accelerate(s: Script) -> list[Finding]:
    out: list[Finding] = []
    job_nodes, gpus = leading_int(s.directives.get("nodes")) or 1, gpus_per_node(s.directives)
    for ln in s.launches:
        if ln.launcher not in _NODES_OPTION:
            continue
        # deepspeed reaches the other nodes itself (pdsh/ssh over its hostfile); accelerate needs srun for that
        nodes = step_nodes(ln, job_nodes) if ln.under_srun else job_nodes
        out += _check_nodes(ln, nodes)
        out += _check_processes(ln, nodes, gpus)
        out += _check_machine_rank(ln, nodes)
    return out


def _check_nodes(ln: Launch, nodes: int) -> list[Finding]:
    key = _NODES_OPTION[ln.launcher or ""]
    value = ln.launcher_opts.get(key, "")
    if not value.isdigit() or int(value) == nodes or (nodes == 1 and int(value) < 1):
        return []
    spelled = f"--{key.replace('-', '_')}={value}"
    why = (f"{nodes - int(value)} of the {nodes} nodes stay idle" if int(value) < nodes else
           "the launchers wait for nodes that never come")
    return [Finding("error", "launcher-nodes", f"line {ln.line}: {ln.launcher} {spelled} but the job has {nodes} "
                    f"node(s): {why}.", f"--{key.replace('-', '_')}=$SLURM_NNODES.")]


def _check_processes(ln: Launch, nodes: int, gpus: int | None) -> list[Finding]:
    value = ln.launcher_opts.get("num-processes", "")
    if ln.launcher != "accelerate" or not value.isdigit() or not gpus or int(value) == nodes * gpus:
        return []
    return [Finding("error", "launcher-processes",
                    f"line {ln.line}: accelerate --num_processes={value} but {nodes} node(s) x {gpus} GPU(s) = "
                    f"{nodes * gpus}: accelerate counts the processes of all machines together, so "
                    + ("GPUs stay idle." if int(value) < nodes * gpus else "ranks wait for processes that never come."),
                    f"--num_processes=$((SLURM_NNODES * {gpus})).")]


def _check_machine_rank(ln: Launch, nodes: int) -> list[Finding]:
    """The static rendezvous needs each node's own rank; c10d (`--rdzv_backend c10d`) ignores it."""
    rank = ln.launcher_opts.get("machine-rank")
    if ln.launcher != "accelerate" or nodes < 2 or rank is None:
        return []
    if ln.launcher_opts.get("rdzv-backend", "static") != "static":
        return []
    if "$" in rank and not batch_expanded(rank) and ln.per_task:
        return []
    why = ("is the same on every node" if "$" not in rank and not batch_expanded(rank) else
           "is expanded once, by the batch shell before srun starts, to the same value on every node")
    return [Finding("error", "launcher-node-rank",
                    f"line {ln.line}: accelerate --machine_rank={shown(rank)} {why}, with the static rendezvous: "
                    "all machines claim the same ranks and the job hangs.",
                    "add --rdzv_backend c10d (the rank is then ignored), or let each task expand it: "
                    "srun bash -c 'accelerate launch --machine_rank $SLURM_NODEID ...' (single quotes).")]


def check_batch_expanded(s: Script) -> list[Finding]:
    """`srun python train.py --rank=$SLURM_PROCID`: the batch shell expands it once, to 0, for every task."""
    out = []
    for ln in s.launches:
        if not ln.under_srun:
            continue
        skip = {ln.launcher_opts.get(key) for key in _RANK_OPTIONS}
        for word in ln.words:
            name = batch_expanded(word)
            if name is None or word in skip or any(word.lstrip("-").replace("_", "-").startswith(key + "=")
                                                   for key in _RANK_OPTIONS):
                continue
            out.append(Finding("error", "batch-shell-rank",
                               f"line {ln.line}: `{shown(word)}` is expanded once, by the batch shell before srun "
                               f"starts, where {name} is 0: every task gets the same value.",
                               f"let each task expand it: srun bash -c '... ${name} ...' (single quotes), or drop "
                               "it: torchslurm.init() and the launchers give each rank its own."))
            break
    return out
