"""lint rules of how the torchrun launchers of a multi-node step find each other (torch/distributed/run.py's
rules: --rdzv-endpoint, --standalone, --nnodes, --node-rank, --master-addr). deepspeed and accelerate are
launchers.py's; fixed ports are ports.py's. Pure, nothing executed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from torchslurm.lint.allocation import step_nodes
from torchslurm.lint.parse import TORCHRUN_LIKE, Launch
from torchslurm.lint.rule import Facts, Flag, rule
from torchslurm.lint.shell import batch_expanded, shown
from torchslurm.runtime.ports import RDZV_PORT_EXPR

__all__: list[str] = []

_RDZV_HINT = ("--rdzv-backend=c10d --rdzv-endpoint=\"$head:$port\" --rdzv-id=$SLURM_JOB_ID --nnodes=$SLURM_NNODES, "
              "with head=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) and "
              f"port={RDZV_PORT_EXPR} set before srun (or `torchslurm script --launch torchrun`).")
_NODE_RANK_HINT = ("--node-rank=$SLURM_NODEID, expanded by each task: export MASTER_ADDR=$(scontrol show hostnames "
                   "\"$SLURM_JOB_NODELIST\" | head -n1), then srun bash -c 'exec torchrun --node-rank=$SLURM_NODEID "
                   "--master-addr=$MASTER_ADDR ...' (single quotes: each task expands them; in `srun torchrun ...` "
                   "the batch shell expands $SLURM_NODEID once, to 0); or drop --master-addr and --node-rank for "
                   "the c10d rendezvous: ")


def _nnodes(ln: Launch) -> tuple[int, int] | None:
    """torchrun's --nnodes as (min, max): `2`, `1:4`, absent = 1 (its default); None when not literal."""
    value = ln.launcher_opts.get("nnodes", "1")
    m = re.fullmatch(r"([0-9]{1,9})(?::([0-9]{1,9}))?", value)
    return None if m is None else (int(m.group(1)), int(m.group(2) or m.group(1)))


def _torchruns(x: Facts) -> Iterator[tuple[Launch, int, bool]]:
    """Each torchrun (or torch.distributed.launch) line, the nodes srun starts it on, and whether its
    rendezvous spans several nodes."""
    for ln in x.script.launches:
        if ln.launcher in TORCHRUN_LIKE:
            nodes, nnodes = step_nodes(ln, x.allocation.nodes), _nnodes(ln)
            yield ln, nodes, nnodes[1] > 1 if nnodes else nodes > 1


def _static(ln: Launch) -> bool:
    """The static rendezvous (torchrun's default backend), where each node must say its own --node-rank."""
    return "standalone" not in ln.launcher_opts and ln.launcher_opts.get("rdzv-backend", "static") == "static"


@rule("torchrun-no-rendezvous", ("error",),
      "a multi-node torchrun with no `--rdzv-endpoint` (or `--master-addr`): each node waits on its own localhost.")
def torchrun_no_rendezvous(x: Facts) -> Iterator[Flag]:
    for ln, _, multi in _torchruns(x):
        opts = ln.launcher_opts
        static = opts.get("rdzv-backend", "static") == "static"
        endpoint = "rdzv-endpoint" in opts or ("master-addr" in opts and static)
        if multi and "standalone" not in opts and not endpoint:
            # run.py get_rdzv_endpoint: only the static backend falls back to --master-addr (default 127.0.0.1)
            yield Flag("error", f"{ln.launcher} --nnodes={opts.get('nnodes')} without --rdzv-endpoint (or "
                       "--master-addr): each node's launcher waits for the other nodes on its own localhost "
                       "(127.0.0.1:29500), and the job hangs until the rendezvous times out.", _RDZV_HINT, ln.line)


@rule("torchrun-standalone", ("error",), "`torchrun --standalone` on each node of a multi-node step: separate "
      "trainings.", supersedes=("torchrun-nnodes",))
def torchrun_standalone(x: Facts) -> Iterator[Flag]:
    for ln, nodes, _ in _torchruns(x):
        if nodes > 1 and "standalone" in ln.launcher_opts:
            yield Flag("error", f"{ln.launcher} --standalone on each of the {nodes} nodes of the step: every node "
                       "runs its own separate training with a rendezvous on localhost, i.e. "
                       f"{nodes} independent jobs writing the same checkpoints.",
                       f"replace --standalone with {_RDZV_HINT}", ln.line)


@rule("torchrun-nnodes", ("error",), "torchrun's `--nnodes` (default 1) does not match the nodes srun starts it on.")
def torchrun_nnodes(x: Facts) -> Iterator[Flag]:
    for ln, nodes, _ in _torchruns(x):
        opts, nnodes = ln.launcher_opts, _nnodes(ln)
        if nodes > 1 and nnodes and not nnodes[0] <= nodes <= nnodes[1]:
            given = f"--nnodes={opts['nnodes']}" if "nnodes" in opts else "no --nnodes (torchrun's default: 1)"
            why = ("every node runs its own separate training" if nnodes[1] == 1 else
                   "the rendezvous " + ("waits for nodes that never come" if nodes < nnodes[0] else
                                        f"takes {nnodes[1]} of them and the others wait"))
            yield Flag("error", f"{ln.launcher} with {given}, but srun starts it on {nodes} nodes: {why}.",
                       "--nnodes=$SLURM_NNODES (one launcher per node of the step).", ln.line)


@rule("torchrun-node-rank", ("error",),
      "the static rendezvous with no `--node-rank`, or one that is the same on every node (a literal, or "
      "`$SLURM_NODEID` expanded by the batch shell). Ignored with `--rdzv-backend=c10d`.")
def torchrun_node_rank(x: Facts) -> Iterator[Flag]:
    for ln, _, multi in _torchruns(x):
        opts = ln.launcher_opts
        if not multi or not _static(ln):
            continue
        rank, source = opts.get("node-rank"), ("--master-addr" if "master-addr" in opts else
                                               "--rdzv-endpoint without --rdzv-backend=c10d")
        if rank is None and ("master-addr" in opts or "rdzv-endpoint" in opts):
            yield Flag("error", f"{ln.launcher} with the static rendezvous ({source}) on several nodes and no "
                       "--node-rank: every node takes node rank 0 (the default), so all claim the same ranks and "
                       "the job hangs or builds the wrong world.", _NODE_RANK_HINT + _RDZV_HINT, ln.line)
        elif rank is not None and (batch_expanded(rank) or "$" not in rank or not ln.per_task):
            why = ("is the same on every node" if "$" not in rank and not batch_expanded(rank) else
                   "is expanded once, by the batch shell before srun starts, to the same value on every node")
            yield Flag("error", f"{ln.launcher} --node-rank={shown(rank)} {why}: all nodes claim the same ranks and "
                       "the job hangs or builds the wrong world.", _NODE_RANK_HINT + _RDZV_HINT, ln.line)


@rule("torchrun-master-addr", ("error",),
      "`--master-addr=$(hostname)` expanded in each task: every node names itself. (In the batch shell, "
      "`` `hostname` `` is the first node: right.)")
def torchrun_master_addr(x: Facts) -> Iterator[Flag]:
    for ln, _, multi in _torchruns(x):
        addr = ln.launcher_opts.get("master-addr", "")
        if multi and _static(ln) and ln.per_task and re.search(r"\$\(\s*hostname|`\s*hostname", addr):
            yield Flag("error", f"{ln.launcher} --master-addr={addr} is expanded by each task, so every node names "
                       "itself as the master and no node finds the others.",
                       "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) before "
                       "srun, and --master-addr=$MASTER_ADDR inside the quotes.", ln.line)
