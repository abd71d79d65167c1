"""What a script's allocation is, as far as its `#SBATCH` directives say: nodes, tasks and GPUs per node,
and the layout each srun step takes of it. Pure; the rules read these, they judge nothing themselves."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from torchslurm.lint.parse import Launch

__all__ = ["Allocation", "gpus_per_node", "leading_int", "step_nodes", "step_tasks_per_node", "tasks_per_node"]


def leading_int(value: str | None) -> int | None:
    """The whole number at the start of an option's value (`2` of `--nodes=2-4`), None if there is none."""
    m = re.match(r"[0-9]+", value or "")
    return int(m.group(0)) if m and len(m.group(0)) <= 18 else None  # 18 digits: past any count


def gpus_per_node(d: Mapping[str, str]) -> int | None:
    """GPUs per node asked for by --gpus-per-node, --gres=gpu[:type]:N, --gpus-per-task or --gpus."""
    if "gpus-per-node" in d:
        return leading_int(d["gpus-per-node"].split(":")[-1])
    for item in d.get("gres", "").split(","):
        name, *rest = item.split(":")
        if name == "gpu":  # gpu[:type][:count], the count 1 when not given (sbatch(1), --gres)
            count = leading_int(rest[-1]) if rest else None
            return 1 if count is None else count
    per_task, tasks = leading_int(d.get("gpus-per-task")), tasks_per_node(d)
    if per_task is not None and tasks is not None:
        return per_task * tasks
    total, nodes = leading_int(d.get("gpus", "").split(":")[-1]), leading_int(d.get("nodes")) or 1
    return None if total is None else total // nodes


def tasks_per_node(d: Mapping[str, str]) -> int | None:
    """Tasks per node asked for by --ntasks-per-node, or --ntasks over --nodes: on the first nodes, which Slurm's
    block layout fills first (--ntasks=9 over 2 nodes: 5 and 4)."""
    if "ntasks-per-node" in d:
        return leading_int(d["ntasks-per-node"])
    ntasks, nodes = leading_int(d.get("ntasks")), leading_int(d.get("nodes"))
    if ntasks:  # --ntasks=0 is the invalid-value rule's
        return -(-ntasks // (nodes or ntasks))
    return None


@dataclass(frozen=True)
class Allocation:
    """The job's allocation as the directives fix it (Slurm's defaults where they say nothing)."""

    nodes: int
    """--nodes (its minimum), 1 when not given."""
    tasks_per_node: int | None
    """--ntasks-per-node, or --ntasks over --nodes; None when neither is given."""
    gpus_per_node: int | None
    """GPUs per node, from whichever GPU option is given; None without one."""
    ntasks: int | None
    """--ntasks as given."""

    @classmethod
    def of(cls, directives: Mapping[str, str]) -> Allocation:
        return cls(nodes=leading_int(directives.get("nodes")) or 1, tasks_per_node=tasks_per_node(directives),
                   gpus_per_node=gpus_per_node(directives), ntasks=leading_int(directives.get("ntasks")))

    @property
    def tasks(self) -> int:
        """Tasks per node, 1 (Slurm's default) when the directives do not say."""
        return self.tasks_per_node or 1

    @property
    def total_tasks(self) -> int:
        """Tasks of the whole job."""
        return self.ntasks or self.tasks * self.nodes


def step_nodes(ln: Launch, job_nodes: int) -> int:
    """Nodes the launch runs on: srun's own -N/-n where literal, else the job's; 1 without srun."""
    if not ln.under_srun:
        return 1
    nodes = leading_int(ln.srun_opts.get("nodes")) or job_nodes  # the minimum of MIN-MAX
    ntasks = leading_int(ln.srun_opts.get("ntasks"))
    return min(nodes, ntasks) if ntasks else nodes


def step_tasks_per_node(ln: Launch, job_nodes: int) -> int | None:
    """Tasks per node when srun sets its own layout (literal --ntasks-per-node, or --ntasks over the nodes)."""
    per_node, ntasks = leading_int(ln.srun_opts.get("ntasks-per-node")), leading_int(ln.srun_opts.get("ntasks"))
    if per_node is None and ntasks is not None:
        per_node = -(-ntasks // step_nodes(ln, job_nodes))  # srun's block layout fills the first nodes
    return per_node
