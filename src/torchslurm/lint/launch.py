"""The checks of the lines that start training in an sbatch script: srun, torchrun, python.

Pure, part of `torchslurm lint` (checks.py runs them): how many ranks each launch line starts per
node against the GPUs the `#SBATCH` directives ask for (gpus_per_node, tasks_per_node), a python
or launcher without srun, one launcher per node, srun's --kill-on-bad-exit, and how the launchers
of a multi-node step rendezvous (torch/distributed/run.py's rules: --rdzv-endpoint, --standalone,
--nnodes, --node-rank, --master-addr, fixed ports). Nothing is executed.
"""

from __future__ import annotations

import re

from torchslurm.jobs.findings import Finding
from torchslurm.lint.parse import Launch, Script
from torchslurm.lint.shell import batch_expanded, shown
from torchslurm.runtime.ports import RDZV_PORT_EXPR

__all__ = ["check_launches", "check_rendezvous", "gpus_per_node", "leading_int", "step_nodes",
           "tasks_per_node"]


def leading_int(value: str | None) -> int | None:
    """The whole number at the start of an option's value (`2` of `--nodes=2-4`), None if there is none."""
    m = re.match(r"^\d+", value or "")
    return int(m.group(0)) if m else None


def gpus_per_node(d: dict[str, str]) -> int | None:
    """GPUs per node asked for by --gpus-per-node, --gres=gpu[:type]:N, --gpus-per-task or --gpus."""
    if "gpus-per-node" in d:
        return leading_int(d["gpus-per-node"].split(":")[-1])
    for item in d.get("gres", "").split(","):
        parts = item.split(":")
        if parts[0] == "gpu":
            return leading_int(parts[-1]) if len(parts) > 1 else 1
    per_task, tasks = leading_int(d.get("gpus-per-task")), tasks_per_node(d)
    if per_task is not None and tasks is not None:
        return per_task * tasks
    total, nodes = leading_int(d.get("gpus", "").split(":")[-1]), leading_int(d.get("nodes")) or 1
    return None if total is None else total // nodes


def tasks_per_node(d: dict[str, str]) -> int | None:
    """Tasks per node asked for by --ntasks-per-node, or --ntasks over --nodes."""
    if "ntasks-per-node" in d:
        return leading_int(d["ntasks-per-node"])
    ntasks, nodes = leading_int(d.get("ntasks")), leading_int(d.get("nodes"))
    if ntasks:  # --ntasks=0 is reported by _check_values
        return ntasks // (nodes or ntasks)
    return None

def check_launches(s: Script) -> list[Finding]:
    d, out = s.directives, []
    gpus, tasks = gpus_per_node(d), tasks_per_node(d) or 1
    nodes = leading_int(d.get("nodes")) or 1
    total = leading_int(d.get("ntasks")) or tasks * nodes
    stepped = any(other.under_srun for other in s.launches)
    for ln in s.launches:
        where = f"line {ln.line}"
        if ln.launcher == "torch.distributed.launch":
            out.append(Finding("warning", "deprecated-launch",
                               f"{where}: python -m torch.distributed.launch is deprecated (it passes --local-rank "
                               "as an argument and is removed in recent torch).",
                               "use torchrun (python -m torch.distributed.run), or srun with one task per GPU."))
        if ln.launcher is None and not ln.under_srun and (total > 1 or nodes > 1) and not stepped:
            # data preparation before, or evaluation after, an srun'd training step is normal
            out.append(Finding("error", "python-without-srun",
                               f"{where}: `{ln.python} ...` runs once, in the batch shell on the first node, but the "
                               f"allocation has {total} task(s) on {nodes} node(s).",
                               f"srun {ln.python} ... (one rank per task), or `torchslurm run`."))
        if ln.launcher not in (None, "deepspeed") and not ln.under_srun and nodes > 1:  # deepspeed: pdsh/ssh
            out.append(Finding("error", "launcher-without-srun",
                               f"{where}: {ln.launcher} runs only on the first of {nodes} nodes without srun.",
                               "srun --ntasks-per-node=1 torchrun ... (one launcher per node)."))
        step = ln.srun_opts.get("ntasks-per-node")  # srun's own layout; -n $SLURM_NNODES: lint can't count
        per_node = tasks if step is None and "ntasks" not in ln.srun_opts else (
            leading_int(step) or _step_tasks_per_node(ln, nodes) or 1)
        if ln.launcher is not None and ln.under_srun and per_node > 1:
            workers = f" x {ln.nproc_per_node} = {per_node * ln.nproc_per_node} worker(s) per node" + (
                f" on {gpus} GPU(s)" if gpus else "") if ln.nproc_per_node else ""
            out.append(Finding("error", "launcher-per-task",
                               f"{where}: srun starts {ln.launcher} in each of the {per_node} tasks per node, and each "
                               f"starts its own workers{workers}.",
                               "#SBATCH --ntasks-per-node=1 for launcher jobs (or srun -n $SLURM_NNODES "
                               "--ntasks-per-node=1)."))
        if ln.launcher is not None and gpus and ln.nproc_per_node is not None and ln.nproc_per_node != gpus:
            out.append(Finding("error", "nproc-vs-gpus",
                               f"{where}: --nproc-per-node={ln.nproc_per_node} but {gpus} GPU(s) per node are "
                               "allocated.", f"--nproc-per-node={gpus}."))
        step_tasks = _step_tasks_per_node(ln, nodes)
        if ln.launcher is None and ln.under_srun and gpus and step_tasks is not None and step_tasks != gpus:
            given = " ".join(f"--{k}={ln.srun_opts[k]}" for k in ("ntasks", "ntasks-per-node") if k in ln.srun_opts)
            if step_tasks < gpus:
                out.append(Finding("warning", "srun-tasks-vs-gpus",
                                   f"{where}: srun {given} starts {step_tasks} rank(s) per node, overriding #SBATCH's "
                                   f"{tasks}, and {gpus - step_tasks} of the {gpus} GPU(s) per node stay idle.",
                                   f"srun --ntasks-per-node={gpus} (one rank per GPU), or drop {given} to use the "
                                   "job's layout."))
            else:
                out.append(Finding("error", "srun-tasks-vs-gpus",
                                   f"{where}: srun {given} starts {step_tasks} rank(s) per node on {gpus} GPU(s) per "
                                   "node: ranks share a GPU, which NCCL refuses (\"Duplicate GPU detected\").",
                                   f"srun --ntasks-per-node={gpus} (one rank per GPU)."))
        elif ln.launcher is None and ln.under_srun and gpus and step_tasks is None and tasks != gpus:
            out.append(Finding("error", "tasks-vs-gpus",
                               f"{where}: srun runs one rank per task: {tasks} task(s) per node but {gpus} GPU(s) "
                               "per node.",
                               f"#SBATCH --ntasks-per-node={gpus}, or one task per node running torchrun."))
        kill = ln.srun_opts.get("kill-on-bad-exit")
        if ln.under_srun and (total > 1 or nodes > 1) and (kill is None or kill.lstrip("=") == "0"):
            who = f"one rank (or one node's {ln.launcher} agent)" if ln.launcher else "one rank"
            out.append(Finding("info", "no-kill-on-bad-exit",
                               f"{where}: srun without --kill-on-bad-exit: when {who} dies, the others wait in "
                               "their collectives until the group timeout (torch's default: 30 min) and the job "
                               "holds its nodes meanwhile.",
                               "srun --kill-on-bad-exit=1 ... (unless the cluster sets KillOnBadExit=1)."))
    return out


_RDZV_HINT = ("--rdzv-backend=c10d --rdzv-endpoint=\"$head:$port\" --rdzv-id=$SLURM_JOB_ID --nnodes=$SLURM_NNODES, "
              "with head=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) and "
              f"port={RDZV_PORT_EXPR} set before srun (or `torchslurm script --launch torchrun`).")


def _step_tasks_per_node(ln: Launch, job_nodes: int) -> int | None:
    """Tasks per node when srun sets its own layout (literal --ntasks-per-node, or --ntasks over the nodes)."""
    per_node, ntasks = leading_int(ln.srun_opts.get("ntasks-per-node")), leading_int(ln.srun_opts.get("ntasks"))
    if per_node is None and ntasks is not None:
        per_node = -(-ntasks // step_nodes(ln, job_nodes))  # srun's block layout fills the first nodes
    return per_node


def step_nodes(ln: Launch, job_nodes: int) -> int:
    """Nodes the launch runs on: srun's own -N/-n where literal, else the job's; 1 without srun."""
    if not ln.under_srun:
        return 1
    nodes = leading_int(ln.srun_opts.get("nodes", "").split("-")[0]) or job_nodes
    ntasks = leading_int(ln.srun_opts.get("ntasks"))
    return min(nodes, ntasks) if ntasks else nodes


def _nnodes(ln: Launch) -> tuple[int, int] | None:
    """torchrun's --nnodes as (min, max): `2`, `1:4`, absent = 1 (its default); None when not literal."""
    value = ln.launcher_opts.get("nnodes", "1")
    m = re.match(r"^(\d+)(?::(\d+))?$", value)
    return None if m is None else (int(m.group(1)), int(m.group(2) or m.group(1)))


def check_rendezvous(s: Script) -> list[Finding]:
    """How the launchers of a multi-node step find each other (torch/distributed/run.py)."""
    out, job_nodes = [], leading_int(s.directives.get("nodes")) or 1
    for ln in s.launches:
        if ln.launcher not in ("torchrun", "torch.distributed.launch"):  # deepspeed, accelerate: launchers.py
            continue
        opts, where, nodes, nnodes = ln.launcher_opts, f"line {ln.line}", step_nodes(ln, job_nodes), _nnodes(ln)
        multi = nnodes[1] > 1 if nnodes else nodes > 1
        static = opts.get("rdzv-backend", "static") == "static"  # torchrun's default
        endpoint = "rdzv-endpoint" in opts or ("master-addr" in opts and static)
        if multi and "standalone" not in opts and not endpoint:
            # run.py get_rdzv_endpoint: only the static backend falls back to --master-addr (default 127.0.0.1)
            out.append(Finding("error", "torchrun-no-rendezvous",
                               f"{where}: {ln.launcher} --nnodes={opts.get('nnodes')} without --rdzv-endpoint (or "
                               "--master-addr): each node's launcher waits for the other nodes on its own localhost "
                               "(127.0.0.1:29500), and the job hangs until the rendezvous times out.", _RDZV_HINT))
        if nodes > 1 and "standalone" in opts:
            out.append(Finding("error", "torchrun-standalone",
                               f"{where}: {ln.launcher} --standalone on each of the {nodes} nodes of the step: "
                               "every node runs its own separate training with a rendezvous on localhost, i.e. "
                               f"{nodes} independent jobs writing the same checkpoints.",
                               f"replace --standalone with {_RDZV_HINT}"))
        elif nodes > 1 and nnodes and not nnodes[0] <= nodes <= nnodes[1]:
            given = f"--nnodes={opts['nnodes']}" if "nnodes" in opts else "no --nnodes (torchrun's default: 1)"
            why = ("every node runs its own separate training" if nnodes[1] == 1 else
                   "the rendezvous " + ("waits for nodes that never come" if nodes < nnodes[0] else
                                        f"takes {nnodes[1]} of them and the others wait"))
            out.append(Finding("error", "torchrun-nnodes",
                               f"{where}: {ln.launcher} with {given}, but srun starts it on {nodes} nodes: {why}.",
                               "--nnodes=$SLURM_NNODES (one launcher per node of the step)."))
        out += _check_static_rendezvous(ln, multi)
    return out


_NODE_RANK_HINT = ("--node-rank=$SLURM_NODEID, expanded by each task: export MASTER_ADDR=$(scontrol show hostnames "
                   "\"$SLURM_JOB_NODELIST\" | head -n1), then srun bash -c 'exec torchrun --node-rank=$SLURM_NODEID "
                   "--master-addr=$MASTER_ADDR ...' (single quotes: each task expands them; in `srun torchrun ...` "
                   "the batch shell expands $SLURM_NODEID once, to 0); or drop --master-addr and --node-rank for "
                   "the c10d rendezvous: ")


def _check_static_rendezvous(ln: Launch, multi: bool) -> list[Finding]:
    """--master-addr/--master-port (the static rendezvous): each node must say its own --node-rank."""
    opts, where = ln.launcher_opts, f"line {ln.line}"
    out: list[Finding] = []
    if "standalone" in opts or opts.get("rdzv-backend", "static") != "static":
        return out
    rank, source = opts.get("node-rank"), ("--master-addr" if "master-addr" in opts else
                                           "--rdzv-endpoint without --rdzv-backend=c10d")
    if multi and rank is None and ("master-addr" in opts or "rdzv-endpoint" in opts):
        out.append(Finding("error", "torchrun-node-rank",
                           f"{where}: {ln.launcher} with the static rendezvous ({source}) on several nodes "
                           "and no --node-rank: every node takes node rank 0 (the default), so all claim the same "
                           "ranks and the job hangs or builds the wrong world.", _NODE_RANK_HINT + _RDZV_HINT))
    elif multi and rank is not None and (batch_expanded(rank) or "$" not in rank or not ln.per_task):
        why = ("is the same on every node" if "$" not in rank and not batch_expanded(rank) else
               "is expanded once, by the batch shell before srun starts, to the same value on every node")
        out.append(Finding("error", "torchrun-node-rank",
                           f"{where}: {ln.launcher} --node-rank={shown(rank)} {why}: all nodes claim the same "
                           "ranks and the job hangs or builds the wrong world.", _NODE_RANK_HINT + _RDZV_HINT))
    addr = opts.get("master-addr", "")
    if multi and ln.per_task and re.search(r"\$\(\s*hostname|`\s*hostname", addr):
        out.append(Finding("error", "torchrun-master-addr",
                           f"{where}: {ln.launcher} --master-addr={addr} is expanded by each task, so every node names "
                           "itself as the master and no node finds the others.",
                           "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) before "
                           "srun, and --master-addr=$MASTER_ADDR inside the quotes."))
    return out
