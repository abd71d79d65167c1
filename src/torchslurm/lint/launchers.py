"""lint rules of deepspeed and `accelerate launch` lines.

deepspeed and accelerate are modelled like torchrun: how many nodes they span (`--num_nodes`,
`--num_machines`), how many processes (`--num_gpus`, `--num_processes`: all machines together for
accelerate), the machine rank. Pure, nothing executed.
"""

from __future__ import annotations

from collections.abc import Iterator

from torchslurm.lint.allocation import step_nodes
from torchslurm.lint.parse import Launch
from torchslurm.lint.rule import Facts, Flag, rule
from torchslurm.lint.shell import batch_expanded, shown

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
        if not value.isdigit() or int(value) == nodes or (nodes == 1 and int(value) < 1):
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
        if ln.launcher != "accelerate" or not value.isdigit() or not gpus or int(value) == nodes * gpus:
            continue
        yield Flag("error", f"accelerate --num_processes={value} but {nodes} node(s) x {gpus} GPU(s) = "
                   f"{nodes * gpus}: accelerate counts the processes of all machines together, so "
                   + ("GPUs stay idle." if int(value) < nodes * gpus else "ranks wait for processes that never come."),
                   f"--num_processes=$((SLURM_NNODES * {gpus})).", ln.line)


@rule("launcher-node-rank", ("error",),
      "accelerate's `--machine_rank` the same on every node with the static rendezvous.")
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
        yield Flag("error", f"accelerate --machine_rank={shown(rank)} {why}, with the static rendezvous: all "
                   "machines claim the same ranks and the job hangs.",
                   "add --rdzv_backend c10d (the rank is then ignored), or let each task expand it: "
                   "srun bash -c 'accelerate launch --machine_rank $SLURM_NODEID ...' (single quotes).", ln.line)
