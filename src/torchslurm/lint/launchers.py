"""lint checks of deepspeed and `accelerate launch` lines, and of per-task variables that the batch
shell expanded into a launch line.

deepspeed and accelerate are modelled like torchrun: how many nodes they span (`--num_nodes`,
`--num_machines`), how many processes (`--num_gpus`, `--num_processes`: all machines together for
accelerate), the machine rank and the main process address. Pure, nothing executed.
"""

from __future__ import annotations

from collections.abc import Iterator

from torchslurm.jobs.findings import Finding
from torchslurm.lint.allocation import Allocation, step_nodes
from torchslurm.lint.parse import Launch
from torchslurm.lint.registry import Context, rule
from torchslurm.lint.shell import batch_expanded, shown

_NODES_OPTION = {"deepspeed": "num-nodes", "accelerate": "num-machines"}
_RANK_OPTIONS = ("node-rank", "machine-rank")


def _launchers(c: Context) -> Iterator[tuple[Launch, int]]:
    """deepspeed and accelerate lines, with the nodes each spans."""
    job_nodes = Allocation.of(c.script).nodes
    for ln in c.script.launches:
        if ln.launcher in _NODES_OPTION:
            # deepspeed reaches the other nodes itself (pdsh/ssh over its hostfile); accelerate needs srun for that
            yield ln, step_nodes(ln, job_nodes) if ln.under_srun else job_nodes


@rule("launcher-nodes", "error",
      summary="deepspeed's --num_nodes or accelerate's --num_machines differ from the job's nodes.")
def launcher_nodes(c: Context) -> Iterator[Finding]:
    for ln, nodes in _launchers(c):
        yield from _check_nodes(ln, nodes)


@rule("launcher-processes", "error", summary="accelerate's --num_processes (all machines) differ from nodes x GPUs.")
def launcher_processes(c: Context) -> Iterator[Finding]:
    gpus = Allocation.of(c.script).gpus_per_node
    for ln, nodes in _launchers(c):
        yield from _check_processes(ln, nodes, gpus)


@rule("launcher-node-rank", "error", summary="accelerate's --machine_rank the same on every node (static rendezvous).")
def launcher_node_rank(c: Context) -> Iterator[Finding]:
    for ln, nodes in _launchers(c):
        yield from _check_machine_rank(ln, nodes)


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


# what torch's env:// rendezvous and most training scripts read from the environment as their own rank
_RANK_ENV = {"RANK", "LOCAL_RANK", "GROUP_RANK"}


@rule("batch-shell-rank", "error", summary="a per-task variable expanded once by the batch shell where it matters.")
def batch_shell_rank(c: Context) -> Iterator[Finding]:
    """A rank variable the batch shell expands once, to task 0's value, for every task: in a launch line
    (`srun python train.py --rank=$SLURM_PROCID`), or exported before srun (`export RANK=$SLURM_PROCID`).
    A variable that is not exported, or that no program reads as its rank, does no harm."""
    yield from _batch_expanded_exports(c)
    yield from _batch_expanded_words(c)


def _batch_expanded_words(c: Context) -> Iterator[Finding]:
    for ln in c.script.launches:
        if not ln.under_srun:
            continue
        skip = {ln.launcher_opts.get(key) for key in _RANK_OPTIONS}
        for word in ln.words:
            name = batch_expanded(word)
            if name is None or word in skip or any(word.lstrip("-").replace("_", "-").startswith(key + "=")
                                                   for key in _RANK_OPTIONS):
                continue
            yield Finding("error", "batch-shell-rank",
                          f"line {ln.line}: `{shown(word)}` is expanded once, by the batch shell before srun "
                          f"starts, where {name} is 0: every task gets the same value.",
                          f"let each task expand it: srun bash -c '... ${name} ...' (single quotes), or drop "
                          "it: torchslurm.init() and the launchers give each rank its own.")
            break


def _batch_expanded_exports(c: Context) -> Iterator[Finding]:
    s = c.script
    if not any(ln.under_srun for ln in s.launches):
        return
    for key, (line, value) in s.exports.items():
        name = batch_expanded(value)
        if name and key in _RANK_ENV and key in s.exported:
            yield Finding("error", "batch-shell-rank",
                          f"line {line}: {key}={shown(value)} is evaluated once in the batch shell, where {name} "
                          "is 0; every rank gets the same value.",
                          f"remove it: each task sets {key} from its own SLURM_* variables "
                          "(torchslurm.init() reads them).")
