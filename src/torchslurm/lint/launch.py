"""The rules of the lines that start training in an sbatch script: srun, torchrun, python.

How many ranks each launch line starts per node against the GPUs the `#SBATCH` directives ask for
(lint.allocation), a python or launcher without srun, one launcher per node, srun's
--kill-on-bad-exit, and how the launchers of a multi-node step rendezvous (torch/distributed/run.py's
rules: --rdzv-endpoint, --standalone, --nnodes, --node-rank, --master-addr). Pure, nothing executed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from torchslurm.jobs.findings import Finding
from torchslurm.lint.allocation import Allocation, leading_int, step_nodes, step_tasks_per_node
from torchslurm.lint.parse import Launch
from torchslurm.lint.registry import Context, rule
from torchslurm.lint.shell import batch_expanded, shown
from torchslurm.runtime.ports import RDZV_PORT_EXPR


@rule("deprecated-launch", "warning", summary="`python -m torch.distributed.launch`.")
def deprecated_launch(c: Context) -> Iterator[Finding]:
    for ln in c.script.launches:
        if ln.launcher == "torch.distributed.launch":
            yield Finding("warning", "deprecated-launch",
                          f"line {ln.line}: python -m torch.distributed.launch is deprecated (it passes --local-rank "
                          "as an argument and is removed in recent torch).",
                          "use torchrun (python -m torch.distributed.run), or srun with one task per GPU.")


@rule("python-without-srun", "error", summary="the training runs without srun in a multi-task allocation.")
def python_without_srun(c: Context) -> Iterator[Finding]:
    a, stepped = Allocation.of(c.script), any(ln.under_srun for ln in c.script.launches)
    if stepped or not a.several_tasks:  # data preparation before, or evaluation after, an srun'd step is normal
        return
    for ln in c.script.launches:
        if ln.launcher is None and not ln.under_srun:
            yield Finding("error", "python-without-srun",
                          f"line {ln.line}: `{ln.python} ...` runs once, in the batch shell on the first node, but "
                          f"the allocation has {a.total_tasks} task(s) on {a.nodes} node(s).",
                          f"srun {ln.python} ... (one rank per task), or `torchslurm run`.")


@rule("launcher-without-srun", "error", summary="torchrun/accelerate without srun on a multi-node job.")
def launcher_without_srun(c: Context) -> Iterator[Finding]:
    nodes = Allocation.of(c.script).nodes
    for ln in c.script.launches:
        if ln.launcher not in (None, "deepspeed") and not ln.under_srun and nodes > 1:  # deepspeed: pdsh/ssh
            yield Finding("error", "launcher-without-srun",
                          f"line {ln.line}: {ln.launcher} runs only on the first of {nodes} nodes without srun.",
                          "srun --ntasks-per-node=1 torchrun ... (one launcher per node).")


@rule("launcher-per-task", "error", summary="srun starts the launcher in several tasks per node.")
def launcher_per_task(c: Context) -> Iterator[Finding]:
    a = Allocation.of(c.script)
    for ln in c.script.launches:
        step = ln.srun_opts.get("ntasks-per-node")  # srun's own layout; -n $SLURM_NNODES: lint can't count
        per_node = a.tasks_per_node if step is None and "ntasks" not in ln.srun_opts else (
            leading_int(step) or step_tasks_per_node(ln, a.nodes) or 1)
        if ln.launcher is None or not ln.under_srun or per_node <= 1:
            continue
        gpus = a.gpus_per_node
        workers = f" x {ln.nproc_per_node} = {per_node * ln.nproc_per_node} worker(s) per node" + (
            f" on {gpus} GPU(s)" if gpus else "") if ln.nproc_per_node else ""
        yield Finding("error", "launcher-per-task",
                      f"line {ln.line}: srun starts {ln.launcher} in each of the {per_node} tasks per node, and "
                      f"each starts its own workers{workers}.",
                      "#SBATCH --ntasks-per-node=1 for launcher jobs (or srun -n $SLURM_NNODES --ntasks-per-node=1).")


@rule("nproc-vs-gpus", "error", summary="a launcher's processes per node differ from the GPUs per node.")
def nproc_vs_gpus(c: Context) -> Iterator[Finding]:
    gpus = Allocation.of(c.script).gpus_per_node
    for ln in c.script.launches:
        if ln.launcher is not None and gpus and ln.nproc_per_node is not None and ln.nproc_per_node != gpus:
            yield Finding("error", "nproc-vs-gpus",
                          f"line {ln.line}: --nproc-per-node={ln.nproc_per_node} but {gpus} GPU(s) per node are "
                          "allocated.", f"--nproc-per-node={gpus}.")


def _srun_python(c: Context) -> Iterator[tuple[Launch, Allocation, int, int | None]]:
    """Plain python under srun on GPUs: the launch, the allocation, its GPUs and srun's own tasks per node."""
    a = Allocation.of(c.script)
    for ln in c.script.launches:
        if ln.launcher is None and ln.under_srun and a.gpus_per_node:
            yield ln, a, a.gpus_per_node, step_tasks_per_node(ln, a.nodes)


@rule("srun-tasks-vs-gpus", "error", "warning", summary="srun's own task count per node differs from the GPUs.")
def srun_tasks_vs_gpus(c: Context) -> Iterator[Finding]:
    for ln, a, gpus, step_tasks in _srun_python(c):
        if step_tasks is None or step_tasks == gpus:
            continue
        given = " ".join(f"--{k}={ln.srun_opts[k]}" for k in ("ntasks", "ntasks-per-node") if k in ln.srun_opts)
        if step_tasks < gpus:
            yield Finding("warning", "srun-tasks-vs-gpus",
                          f"line {ln.line}: srun {given} starts {step_tasks} rank(s) per node, overriding #SBATCH's "
                          f"{a.tasks_per_node}, and {gpus - step_tasks} of the {gpus} GPU(s) per node stay idle.",
                          f"srun --ntasks-per-node={gpus} (one rank per GPU), or drop {given} to use the job's layout.")
        else:
            yield Finding("error", "srun-tasks-vs-gpus",
                          f"line {ln.line}: srun {given} starts {step_tasks} rank(s) per node on {gpus} GPU(s) per "
                          "node: ranks share a GPU, which NCCL refuses (\"Duplicate GPU detected\").",
                          f"srun --ntasks-per-node={gpus} (one rank per GPU).")


@rule("tasks-vs-gpus", "error", summary="`srun python` runs one rank per task: tasks per node differ from GPUs.")
def tasks_vs_gpus(c: Context) -> Iterator[Finding]:
    for ln, a, gpus, step_tasks in _srun_python(c):
        if step_tasks is None and a.tasks_per_node != gpus:
            yield Finding("error", "tasks-vs-gpus",
                          f"line {ln.line}: srun runs one rank per task: {a.tasks_per_node} task(s) per node but "
                          f"{gpus} GPU(s) per node.",
                          f"#SBATCH --ntasks-per-node={gpus}, or one task per node running torchrun.")


@rule("no-kill-on-bad-exit", "info", summary="srun without --kill-on-bad-exit: survivors wait for the timeout.")
def no_kill_on_bad_exit(c: Context) -> Iterator[Finding]:
    if not Allocation.of(c.script).several_tasks:
        return
    for ln in c.script.launches:
        kill = ln.srun_opts.get("kill-on-bad-exit")
        if ln.under_srun and (kill is None or kill.lstrip("=") == "0"):
            who = f"one rank (or one node's {ln.launcher} agent)" if ln.launcher else "one rank"
            yield Finding("info", "no-kill-on-bad-exit",
                          f"line {ln.line}: srun without --kill-on-bad-exit: when {who} dies, the others wait in "
                          "their collectives until the group timeout (torch's default: 30 min) and the job holds its "
                          "nodes meanwhile.",
                          "srun --kill-on-bad-exit=1 ... (unless the cluster sets KillOnBadExit=1).")


_RDZV_HINT = ("--rdzv-backend=c10d --rdzv-endpoint=\"$head:$port\" --rdzv-id=$SLURM_JOB_ID --nnodes=$SLURM_NNODES, "
              "with head=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) and "
              f"port={RDZV_PORT_EXPR} set before srun (or `torchslurm script --launch torchrun`).")


def _nnodes(ln: Launch) -> tuple[int, int] | None:
    """torchrun's --nnodes as (min, max): `2`, `1:4`, absent = 1 (its default); None when not literal."""
    value = ln.launcher_opts.get("nnodes", "1")
    m = re.match(r"^(\d+)(?::(\d+))?$", value)
    return None if m is None else (int(m.group(1)), int(m.group(2) or m.group(1)))


def _torchruns(c: Context) -> Iterator[tuple[Launch, int, tuple[int, int] | None, bool]]:
    """Each torchrun (or torch.distributed.launch): its step's nodes, its --nnodes range, and whether it
    spans several nodes. deepspeed and accelerate are launchers.py's."""
    job_nodes = Allocation.of(c.script).nodes
    for ln in c.script.launches:
        if ln.launcher in ("torchrun", "torch.distributed.launch"):
            nodes, nnodes = step_nodes(ln, job_nodes), _nnodes(ln)
            yield ln, nodes, nnodes, nnodes[1] > 1 if nnodes else nodes > 1


@rule("torchrun-no-rendezvous", "error", summary="a multi-node torchrun without --rdzv-endpoint or --master-addr.")
def torchrun_no_rendezvous(c: Context) -> Iterator[Finding]:
    for ln, _, _, multi in _torchruns(c):
        opts = ln.launcher_opts
        static = opts.get("rdzv-backend", "static") == "static"  # torchrun's default
        endpoint = "rdzv-endpoint" in opts or ("master-addr" in opts and static)
        if multi and "standalone" not in opts and not endpoint:
            # run.py get_rdzv_endpoint: only the static backend falls back to --master-addr (default 127.0.0.1)
            yield Finding("error", "torchrun-no-rendezvous",
                          f"line {ln.line}: {ln.launcher} --nnodes={opts.get('nnodes')} without --rdzv-endpoint (or "
                          "--master-addr): each node's launcher waits for the other nodes on its own localhost "
                          "(127.0.0.1:29500), and the job hangs until the rendezvous times out.", _RDZV_HINT)


@rule("torchrun-standalone", "error", summary="torchrun --standalone on each node of a multi-node step.")
def torchrun_standalone(c: Context) -> Iterator[Finding]:
    for ln, nodes, _, _ in _torchruns(c):
        if nodes > 1 and "standalone" in ln.launcher_opts:
            yield Finding("error", "torchrun-standalone",
                          f"line {ln.line}: {ln.launcher} --standalone on each of the {nodes} nodes of the step: "
                          "every node runs its own separate training with a rendezvous on localhost, i.e. "
                          f"{nodes} independent jobs writing the same checkpoints.",
                          f"replace --standalone with {_RDZV_HINT}")


@rule("torchrun-nnodes", "error", summary="torchrun's --nnodes differs from the nodes srun starts it on.")
def torchrun_nnodes(c: Context) -> Iterator[Finding]:
    for ln, nodes, nnodes, _ in _torchruns(c):
        opts = ln.launcher_opts
        if nodes <= 1 or "standalone" in opts or not nnodes or nnodes[0] <= nodes <= nnodes[1]:
            continue
        given = f"--nnodes={opts['nnodes']}" if "nnodes" in opts else "no --nnodes (torchrun's default: 1)"
        why = ("every node runs its own separate training" if nnodes[1] == 1 else
               "the rendezvous " + ("waits for nodes that never come" if nodes < nnodes[0] else
                                    f"takes {nnodes[1]} of them and the others wait"))
        yield Finding("error", "torchrun-nnodes",
                      f"line {ln.line}: {ln.launcher} with {given}, but srun starts it on {nodes} nodes: {why}.",
                      "--nnodes=$SLURM_NNODES (one launcher per node of the step).")


_NODE_RANK_HINT = ("--node-rank=$SLURM_NODEID, expanded by each task: export MASTER_ADDR=$(scontrol show hostnames "
                   "\"$SLURM_JOB_NODELIST\" | head -n1), then srun bash -c 'exec torchrun --node-rank=$SLURM_NODEID "
                   "--master-addr=$MASTER_ADDR ...' (single quotes: each task expands them; in `srun torchrun ...` "
                   "the batch shell expands $SLURM_NODEID once, to 0); or drop --master-addr and --node-rank for "
                   "the c10d rendezvous: ")


def _static(ln: Launch) -> bool:
    """--master-addr/--master-port (the static rendezvous): each node must say its own --node-rank."""
    return "standalone" not in ln.launcher_opts and ln.launcher_opts.get("rdzv-backend", "static") == "static"


@rule("torchrun-node-rank", "error", summary="the static rendezvous without a --node-rank of each node's own.")
def torchrun_node_rank(c: Context) -> Iterator[Finding]:
    for ln, _, _, multi in _torchruns(c):
        opts = ln.launcher_opts
        if not multi or not _static(ln):
            continue
        rank, source = opts.get("node-rank"), ("--master-addr" if "master-addr" in opts else
                                               "--rdzv-endpoint without --rdzv-backend=c10d")
        if rank is None and ("master-addr" in opts or "rdzv-endpoint" in opts):
            yield Finding("error", "torchrun-node-rank",
                          f"line {ln.line}: {ln.launcher} with the static rendezvous ({source}) on several nodes "
                          "and no --node-rank: every node takes node rank 0 (the default), so all claim the same "
                          "ranks and the job hangs or builds the wrong world.", _NODE_RANK_HINT + _RDZV_HINT)
        elif rank is not None and (batch_expanded(rank) or "$" not in rank or not ln.per_task):
            why = ("is the same on every node" if "$" not in rank and not batch_expanded(rank) else
                   "is expanded once, by the batch shell before srun starts, to the same value on every node")
            yield Finding("error", "torchrun-node-rank",
                          f"line {ln.line}: {ln.launcher} --node-rank={shown(rank)} {why}: all nodes claim the same "
                          "ranks and the job hangs or builds the wrong world.", _NODE_RANK_HINT + _RDZV_HINT)


@rule("torchrun-master-addr", "error", summary="`--master-addr=$(hostname)` expanded in each task.")
def torchrun_master_addr(c: Context) -> Iterator[Finding]:
    for ln, _, _, multi in _torchruns(c):
        addr = ln.launcher_opts.get("master-addr", "")
        if multi and _static(ln) and ln.per_task and re.search(r"\$\(\s*hostname|`\s*hostname", addr):
            yield Finding("error", "torchrun-master-addr",
                          f"line {ln.line}: {ln.launcher} --master-addr={addr} is expanded by each task, so every "
                          "node names itself as the master and no node finds the others.",
                          "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) before "
                          "srun, and --master-addr=$MASTER_ADDR inside the quotes.")
