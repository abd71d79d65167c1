"""lint rules of deepspeed, `accelerate launch`, and the launchers that reach other nodes themselves.

deepspeed and accelerate are modelled like torchrun: how many nodes they span (`--num_nodes`,
`--num_machines`), how many processes (`--num_gpus`, `--num_processes`: all machines together for
accelerate), the machine rank. Pure, nothing executed.
"""

from __future__ import annotations

from collections.abc import Iterator

from torchslurm.lint.allocation import leading_int, step_nodes, step_tasks_per_node
from torchslurm.lint.parse import Launch
from torchslurm.lint.rule import Facts, Flag, rule
from torchslurm.lint.shell import batch_expanded, shown
from torchslurm.runtime.variables import is_digits

__all__: list[str] = []

_NODES_OPTION = {"deepspeed": "num-nodes", "accelerate": "num-machines"}


def _launches(x: Facts) -> Iterator[tuple[Launch, int]]:
    """Each deepspeed or accelerate line and the nodes it spans: deepspeed reaches the other nodes itself
    (pdsh/ssh over its hostfile); accelerate needs srun for that."""
    for ln in x.script.launches:
        if ln.launcher in _NODES_OPTION:
            yield ln, step_nodes(ln, x.allocation.nodes) if ln.under_srun else x.allocation.nodes


@rule("launcher-nodes", ("error",),
      "`deepspeed --num_nodes=1` / `accelerate launch --num_machines 1` in a 2-node job: nodes idle or ranks wait.")
def launcher_nodes(x: Facts) -> Iterator[Flag]:
    for ln, nodes in _launches(x):
        key = _NODES_OPTION[ln.launcher or ""]
        value = ln.launcher_opts.get(key, "")
        if not is_digits(value) or int(value) == nodes or (nodes == 1 and int(value) < 1):
            continue
        spelled = f"--{key.replace('-', '_')}={value}"
        why = (f"{nodes - int(value)} of the {nodes} nodes stay idle" if int(value) < nodes else
               "the launchers wait for nodes that never come")
        yield Flag("error", f"{ln.launcher} {spelled} but the job has {nodes} node(s): {why}.",
                   f"--{key.replace('-', '_')}=$SLURM_NNODES.", ln.line)


@rule("launcher-processes", ("error",),
      "`accelerate launch --num_processes` (all machines together) ≠ nodes × GPUs.")
def launcher_processes(x: Facts) -> Iterator[Flag]:
    gpus = x.allocation.gpus_per_node
    for ln, nodes in _launches(x):
        value = ln.launcher_opts.get("num-processes", "")
        if ln.launcher != "accelerate" or not is_digits(value) or not gpus or int(value) == nodes * gpus:
            continue
        yield Flag("error", f"accelerate --num_processes={value} but {nodes} node(s) x {gpus} GPU(s) = "
                   f"{nodes * gpus}: accelerate counts the processes of all machines together, so "
                   + ("GPUs stay idle." if int(value) < nodes * gpus else "ranks wait for processes that never come."),
                   f"--num_processes=$((SLURM_NNODES * {gpus})).", ln.line)


@rule("launcher-node-rank", ("error", "warning"),
      "accelerate's `--machine_rank` the same on every node with the static rendezvous (warning when a "
      "`--config_file` may choose c10d, which ignores it).")
def launcher_node_rank(x: Facts) -> Iterator[Flag]:
    """The static rendezvous needs each node's own rank; c10d (`--rdzv_backend c10d`) ignores it."""
    for ln, nodes in _launches(x):
        rank = ln.launcher_opts.get("machine-rank")
        if ln.launcher != "accelerate" or nodes < 2 or rank is None:
            continue
        if ln.launcher_opts.get("rdzv-backend", "static") != "static":
            continue
        if "$" in rank and not batch_expanded(rank) and ln.per_task:
            continue
        why = ("is the same on every node" if "$" not in rank and not batch_expanded(rank) else
               "is expanded once, by the batch shell before srun starts, to the same value on every node")
        hint = ("add --rdzv_backend c10d (the rank is then ignored), or let each task expand it: "
                "srun bash -c 'accelerate launch --machine_rank $SLURM_NODEID ...' (single quotes).")
        if "config-file" in ln.launcher_opts:  # its rdzv_backend may be c10d: lint does not read the file
            yield Flag("warning", f"accelerate --machine_rank={shown(rank)} {why}: unless "
                       f"{ln.launcher_opts['config-file']} sets rdzv_backend: c10d (which ignores it), all machines "
                       "claim the same ranks and the job hangs.", hint, ln.line)
            continue
        yield Flag("error", f"accelerate --machine_rank={shown(rank)} {why}, with the static rendezvous: all "
                   "machines claim the same ranks and the job hangs.", hint, ln.line)


_SSH_LAUNCHERS = {"deepspeed": "deepspeed", "deepy": "gpt-neox's deepy.py", "colossalai": "colossalai run"}


@rule("ssh-launcher-under-srun", ("error",),
      "srun starts deepspeed, gpt-neox's `deepy.py` or `colossalai run` in several tasks: each one starts the whole "
      "job over ssh/pdsh from its hostfile, or trains alone on its node.")
def ssh_launcher_under_srun(x: Facts) -> Iterator[Flag]:
    for ln in x.script.launches:
        if ln.launcher not in _SSH_LAUNCHERS or not ln.under_srun or "no-ssh" in ln.launcher_opts:
            continue
        nodes, per_node = step_nodes(ln, x.allocation.nodes), step_tasks_per_node(ln, x.allocation.nodes)
        tasks = leading_int(ln.srun_opts.get("ntasks")) or nodes * (per_node or x.allocation.tasks)
        if tasks < 2 or (per_node or x.allocation.tasks) > 1 or (not ln.reaches_other_nodes and nodes < 2):
            continue  # one copy; several per node: launcher-per-task says it first
        name = _SSH_LAUNCHERS[ln.launcher or ""]
        why = (f"each one starts the whole job on every node of its hostfile (over pdsh/ssh), so the ranks are "
               f"started {tasks} times" if ln.reaches_other_nodes else
               "without --hostfile each one trains alone on its own node: separate trainings")
        yield Flag("error", f"srun starts {name} in each of its {tasks} tasks: {why}, and the job hangs or trains "
                   "wrong.", f"run {name} once, in the batch shell (no srun: it reaches the nodes itself), or srun "
                   "--nodes=1 --ntasks=1 " + (f"{name} ..." if ln.launcher != "deepy" else "python deepy.py ...")
                   + "; or start one rank per GPU with srun and no launcher.", ln.line)
