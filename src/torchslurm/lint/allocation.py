"""What a script's allocation is, read from its `#SBATCH` directives and a launch line's own srun
options: nodes, tasks and GPUs per node, and the nodes and tasks of one srun step. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchslurm.lint.parse import Launch, Script


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
    if ntasks:  # --ntasks=0 is the invalid-value rule's
        return ntasks // (nodes or ntasks)
    return None


@dataclass(frozen=True)
class Allocation:
    """The job's layout as its directives ask for it (Slurm's defaults where they are silent)."""

    nodes: int
    tasks_per_node: int
    gpus_per_node: int | None
    total_tasks: int

    @classmethod
    def of(cls, s: Script) -> Allocation:
        d = s.directives
        tasks, nodes = tasks_per_node(d) or 1, leading_int(d.get("nodes")) or 1
        return cls(nodes, tasks, gpus_per_node(d), leading_int(d.get("ntasks")) or tasks * nodes)

    @property
    def several_tasks(self) -> bool:
        return self.total_tasks > 1 or self.nodes > 1


def step_nodes(ln: Launch, job_nodes: int) -> int:
    """Nodes the launch runs on: srun's own -N/-n where literal, else the job's; 1 without srun."""
    if not ln.under_srun:
        return 1
    nodes = leading_int(ln.srun_opts.get("nodes", "").split("-")[0]) or job_nodes
    ntasks = leading_int(ln.srun_opts.get("ntasks"))
    return min(nodes, ntasks) if ntasks else nodes


def step_tasks_per_node(ln: Launch, job_nodes: int) -> int | None:
    """Tasks per node when srun sets its own layout (literal --ntasks-per-node, or --ntasks over the nodes)."""
    per_node, ntasks = leading_int(ln.srun_opts.get("ntasks-per-node")), leading_int(ln.srun_opts.get("ntasks"))
    if per_node is None and ntasks is not None:
        per_node = -(-ntasks // step_nodes(ln, job_nodes))  # srun's block layout fills the first nodes
    return per_node
