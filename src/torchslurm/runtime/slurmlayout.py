"""How a Slurm job and its srun step lay tasks out over nodes, read from Slurm's own variables: the
step's nodes, tasks per node, the host of task 0, the job id, and launches that leave nodes out."""

from __future__ import annotations

from collections.abc import Mapping

from torchslurm import hostlist
from torchslurm.errors import EnvError, HostlistError
from torchslurm.runtime.ports import RDZV_PORT_EXPR
from torchslurm.runtime.variables import is_digits

SLURM_SETS_THEM = "these come from Slurm itself; check that no script exports SLURM_* variables by hand."


def slurm_nodes(environ: Mapping[str, str]) -> list[str]:
    """The step's node list (SLURM_STEP_NODELIST before SLURM_JOB_NODELIST), expanded."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if environ.get(name):
            try:
                return hostlist.expand(environ[name])
            except HostlistError as exc:
                raise EnvError(f"{name}={environ[name]!r} is not a valid Slurm hostlist: {exc.message}",
                               f"srun sets {name} to the step's nodes; if a script exports it, remove that "
                               "line (`scontrol show hostnames` expands a valid one).") from exc
    return []


def first_node(nodes: list[str], num_nodes: int) -> str:
    """The host of rank 0: the step's first node; this host (loopback) for a one-node step without a node list."""
    if nodes:
        return nodes[0]
    if num_nodes == 1:
        return "127.0.0.1"
    raise EnvError(f"srun task of a {num_nodes}-node step without a node list (SLURM_STEP_NODELIST and "
                   "SLURM_JOB_NODELIST unset or empty): cannot tell which host runs rank 0.",
                   "srun sets them in every task; do not clear them in the script, or export "
                   "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) before srun.")


def tasks_per_node(environ: Mapping[str, str], node_count: int) -> list[int]:
    name = "SLURM_STEP_TASKS_PER_NODE" if "SLURM_STEP_TASKS_PER_NODE" in environ else "SLURM_TASKS_PER_NODE"
    if name not in environ:
        raise EnvError(
            "srun task without SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE: cannot tell how many "
            "ranks run on this node.", "these are set by srun; do not start tasks with a partial "
            "copy of a Slurm environment."
        )
    try:
        counts = hostlist.expand_counts(environ[name])
    except HostlistError as exc:
        raise EnvError(f"{name}={environ[name]!r} is malformed: {exc.message}",
                       f"srun sets {name} to counts such as '2(x3),1'; if a script exports it, remove that "
                       "line.") from exc
    if node_count and len(counts) != node_count:
        raise EnvError(
            f"{name}={environ[name]!r} lists {len(counts)} node(s) but the step node list has {node_count}.",
            SLURM_SETS_THEM
        )
    return counts


def slurm_job_id(environ: Mapping[str, str]) -> str | None:
    """SLURM_JOB_ID, or ARRAYJOBID_TASKID for an array task (the form scontrol and squeue accept)."""
    if "SLURM_ARRAY_JOB_ID" in environ and "SLURM_ARRAY_TASK_ID" in environ:
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ.get("SLURM_JOB_ID")


def step_node_count(environ: Mapping[str, str]) -> int:
    """Nodes of this srun step (0 outside a step or when Slurm did not say)."""
    if "SLURM_STEP_ID" not in environ:
        return 0
    count = environ.get("SLURM_STEP_NUM_NODES", "")
    if is_digits(count):
        return int(count)
    nodes = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_NODELIST")
    try:
        return len(hostlist.expand(nodes)) if nodes else 0
    except HostlistError:
        return 0


def check_one_group_per_node(environ: Mapping[str, str], world: int, num_nodes: int, who: str) -> None:
    """A launcher's world must span the srun step that started it: `srun -N2 torchrun --standalone`
    (or --nnodes=1, or any launcher told of one node) starts one independent group per node, and
    each trains the whole model alone into the same run_dir."""
    step_nodes = step_node_count(environ)
    if step_nodes <= num_nodes:
        return
    launcher = "torchrun" if who == "torchrun" else "the launcher"
    sizes = (f"GROUP_WORLD_SIZE={environ['GROUP_WORLD_SIZE']}" if "GROUP_WORLD_SIZE" in environ
             else f"LOCAL_WORLD_SIZE={environ.get('LOCAL_WORLD_SIZE', world)}")
    raise EnvError(
        f"{launcher}'s world is {world} rank(s) on {num_nodes} node(s) (WORLD_SIZE={world}, {sizes}) but its srun "
        f"step spans {step_nodes} nodes (SLURM_STEP_NUM_NODES={step_nodes}): each node runs its own separate "
        "training (torchrun --standalone, --nnodes=1 or a launcher's one-node setting under srun), and they would "
        "all write the same checkpoints.",
        f"use one rendezvous for all nodes: srun torchrun --nnodes={step_nodes} --nproc-per-node=N "
        "--rdzv-backend=c10d --rdzv-endpoint=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1):"
        f"{RDZV_PORT_EXPR} --rdzv-id=$SLURM_JOB_ID train.py; or let torchslurm start the ranks: "
        "`torchslurm run train.py` in the batch script.")


def idle_job_nodes(environ: Mapping[str, str], num_nodes: int) -> tuple[EnvError, ...]:
    """torchrun started in the batch shell of a multi-node job (not under srun) uses one node."""
    name = "SLURM_JOB_NUM_NODES" if "SLURM_JOB_NUM_NODES" in environ else "SLURM_NNODES"
    job_nodes = environ.get(name, "")
    if "SLURM_STEP_ID" in environ or not is_digits(job_nodes) or int(job_nodes) <= num_nodes:
        return ()
    return (EnvError(
        f"this Slurm job has {job_nodes} nodes ({name}={job_nodes}) but torchrun, started without "
        f"srun, spans {num_nodes}: the other nodes stay idle.",
        f"srun --ntasks-per-node=1 torchrun --nnodes={job_nodes} --rdzv-backend=c10d --rdzv-endpoint=<first "
        f"node>:{RDZV_PORT_EXPR} train.py, or `torchslurm run train.py`."),)


def srun_locality(environ: Mapping[str, str], world: int) -> tuple[int, int, int] | None:
    """(ranks on this node, this node's index, nodes) of a world started by the srun step this
    process runs in: one rank per task (`srun bash -c 'RANK=$SLURM_PROCID … python train.py'`), or
    the same number per task (a launcher under srun). None outside a step, or when the world does
    not map onto the step's tasks."""
    node = environ.get("SLURM_NODEID", "")
    if "SLURM_STEP_ID" not in environ or not is_digits(node):
        return None
    try:
        per_node = tasks_per_node(environ, len(slurm_nodes(environ)))
    except EnvError:
        return None
    tasks = sum(per_node)
    if not tasks or world % tasks or int(node) >= len(per_node):
        return None
    return per_node[int(node)] * (world // tasks), int(node), len(per_node)


def hosts_store(environ: Mapping[str, str], nodes: list[str], master: str) -> bool | None:
    """Whether this task of an srun step (one rank per task) hosts the store at `master`: the first
    task (SLURM_LOCALID=0) on that node, whatever its rank. Task 0 need not run on the first listed
    node (SLURM_HOSTFILE with --distribution=arbitrary, plane distributions), but every node of a
    step runs a task 0 of its own. None when `master` is not one of the step's nodes (an address
    given by the script): then rank 0 hosts it, as torch does."""
    node = environ.get("SLURM_NODEID", "")
    if "SLURM_STEP_ID" not in environ or master not in nodes or not is_digits(node) or int(node) >= len(nodes):
        return None
    here = environ.get("SLURMD_NODENAME") or nodes[int(node)]
    return here == master and environ.get("SLURM_LOCALID", "0").strip() == "0"
