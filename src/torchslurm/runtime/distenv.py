"""Where this process sits in a distributed job, decided from its environment alone.

`detect(environ)` is a pure function of an environ mapping. Detectors run in priority order:
torchrun (also torchrun inside an srun step: then torchrun's RANK is the truth), Open MPI's
mpirun, an srun task, an sbatch/salloc shell not started by srun, then a plain local process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from torchslurm.errors import EnvError
from torchslurm.runtime.ports import find_free_port, master_port, port_number, slurm_port
from torchslurm.runtime.slurmlayout import (
    SLURM_SETS_THEM,
    check_one_group_per_node,
    first_node,
    hosts_store,
    idle_job_nodes,
    slurm_job_id,
    slurm_nodes,
    srun_locality,
    tasks_per_node,
)
from torchslurm.runtime.variables import check_rank, first_number, first_set, is_digits, require, whole_number

LAUNCHERS = ("torchrun", "mpi", "srun", "batch", "local")
LAUNCHER_VARIABLE = "TORCHSLURM_LAUNCHER"
"""Set by `torchslurm run` for a rank it starts with torchrun-style variables derived from another
launcher (an srun task): that launcher's name, so the rank reports srun, not torchrun."""


@dataclass(frozen=True)
class DistEnv:
    """The placement of this process: everything init_process_group needs, and why."""

    rank: int
    """Global rank, 0 ≤ rank < world_size."""
    local_rank: int
    """Rank among the processes on this node; selects the GPU."""
    world_size: int
    """Number of processes in the job step."""
    local_world_size: int
    """Number of processes on this node."""
    node_rank: int
    """Index of this node among the step's nodes."""
    num_nodes: int
    """Number of nodes in the step."""
    master_addr: str
    """Host of the TCPStore server every rank connects to (see hosts_store for which process serves it)."""
    master_port: int
    """TCP port of the store on master_addr."""
    launcher: str
    """Which launcher started us: one of LAUNCHERS."""
    job_id: str | None
    """SLURM_JOB_ID (with array task as JOBID_TASKID), or None outside Slurm."""
    reason: str
    """One sentence saying how this was decided."""
    warnings: tuple[EnvError, ...] = field(default=())
    """Things that are legal but probably not what the user wanted (reported, never raised)."""
    agent_store: bool = False
    """torchrun's agent hosts the store on master_addr:master_port, so rank 0 is a client too."""
    store_host: bool | None = None
    """Whether this process hosts the store on master_addr (None: rank 0 does, as in torch); under srun
    the first task of the master's node does, wherever rank 0 runs."""
    local_world_known: bool = True
    """False when nothing said how many ranks share this node (RANK/LOCAL_RANK set by hand without
    LOCAL_WORLD_SIZE, outside an srun step): local_world_size is then a guess."""
    restart_count: int = 0
    """How often torchrun's agents restarted the workers (TORCHELASTIC_RESTART_COUNT)."""
    max_restarts: int = 0
    """How often torchrun's agents may restart them (`--max-restarts`, TORCHELASTIC_MAX_RESTARTS)."""

    @property
    def restarts_left(self) -> int:
        """Restarts torchrun's agents still have after this run's workers fail (0 outside torchrun)."""
        return max(self.max_restarts - self.restart_count, 0)

    @property
    def gpu_sharers(self) -> int:
        """Ranks known to share this node's GPUs: local_world_size, or only the ranks up to this one when
        that is a guess (a guess must not refuse a job that would train)."""
        return self.local_world_size if self.local_world_known else self.local_rank + 1

    @property
    def hosts_store(self) -> bool:
        """This process starts the TCPStore server that every rank connects to."""
        if self.agent_store:
            return False
        return self.rank == 0 if self.store_host is None else self.store_host

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def torchrun_environ(self) -> dict[str, str]:
        """The torchrun-style variables a child or init_process_group(env://) reads."""
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def detect(environ: Mapping[str, str], free_port: Callable[[], int] = find_free_port) -> DistEnv:
    """Decide rank, world size and master of this process from `environ`.

    `free_port` is called only when nothing in the environment fixes the port (local runs).
    Raises EnvError when the environment contradicts itself.
    """
    return (
        from_torchrun(environ)
        or from_open_mpi(environ, free_port)
        or from_srun(environ)
        or from_allocation_shell(environ)
        or local(environ, free_port)
    )


def from_torchrun(environ: Mapping[str, str]) -> DistEnv | None:
    """torchrun (or a user) set RANK/WORLD_SIZE; torchrun also sets TORCHELASTIC_RUN_ID."""
    if "RANK" not in environ and "TORCHELASTIC_RUN_ID" not in environ:
        return None
    by_torchrun = "TORCHELASTIC_RUN_ID" in environ
    who = "torchrun" if by_torchrun else "RANK set in the environment"
    if not by_torchrun:
        _check_exported_rank(environ)
    require(environ, ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"), who,
             "start the script with torchrun or `torchslurm run`, or unset RANK so that "
             "torchslurm derives the placement from Slurm.")
    rank, world = whole_number("RANK", environ["RANK"]), whole_number("WORLD_SIZE", environ["WORLD_SIZE"])
    local_rank = whole_number("LOCAL_RANK", environ["LOCAL_RANK"])
    check_rank("RANK", rank, "WORLD_SIZE", world)
    local_world, node_rank, num_nodes, known = _locality(environ, rank, world)
    check_rank("LOCAL_RANK", local_rank, "LOCAL_WORLD_SIZE", local_world)
    if known:
        check_one_group_per_node(environ, world, num_nodes, who)
    store_host, where = None, ""
    if not by_torchrun and _one_rank_per_task(environ, rank, world):
        store_host, where = _store_placement(environ, slurm_nodes(environ), environ["MASTER_ADDR"])
        where = f"; {where}"
    launcher = environ.get(LAUNCHER_VARIABLE)
    return DistEnv(
        rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
        node_rank=node_rank, num_nodes=num_nodes, master_addr=environ["MASTER_ADDR"],
        master_port=port_number(environ["MASTER_PORT"]), launcher=launcher if launcher in LAUNCHERS else "torchrun",
        job_id=slurm_job_id(environ), local_world_known=known,
        warnings=(idle_job_nodes(environ, num_nodes) if by_torchrun else ()) + _unknown_locality(known, world),
        store_host=store_host,
        reason=f"{who}: RANK={rank} of WORLD_SIZE={world}, master "
               f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}{where}.",
        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        restart_count=whole_number("TORCHELASTIC_RESTART_COUNT", environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        max_restarts=whole_number("TORCHELASTIC_MAX_RESTARTS", environ.get("TORCHELASTIC_MAX_RESTARTS", "0")),
    )


def _locality(environ: Mapping[str, str], rank: int, world: int) -> tuple[int, int, int, bool]:
    """(ranks on this node, node index, nodes, whether they are known rather than guessed) of a
    torchrun-style world: torchrun's own variables, else the srun step that started the ranks (a
    `srun bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID …'` launch sets no LOCAL_WORLD_SIZE),
    else a guess of one node."""
    layout = None if "LOCAL_WORLD_SIZE" in environ else srun_locality(environ, world)
    if layout is not None:
        local_world, node, nodes = layout
    else:
        local_world = whole_number("LOCAL_WORLD_SIZE", environ.get("LOCAL_WORLD_SIZE", str(world)))
        check_rank("LOCAL_RANK", 0, "LOCAL_WORLD_SIZE", local_world)
        node, nodes = rank // local_world, -(-world // local_world)
    nodes = whole_number("GROUP_WORLD_SIZE", environ.get("GROUP_WORLD_SIZE", str(nodes)))
    node = whole_number("GROUP_RANK", environ.get("GROUP_RANK", str(node)))
    known = "LOCAL_WORLD_SIZE" in environ or "TORCHELASTIC_RUN_ID" in environ or layout is not None
    return local_world, node, nodes, known


def _one_rank_per_task(environ: Mapping[str, str], rank: int, world: int) -> bool:
    """RANK set per srun task (`srun bash -c 'RANK=$SLURM_PROCID …'`, or `torchslurm run` as an srun task)."""
    return ("SLURM_STEP_ID" in environ and environ.get("SLURM_PROCID", "").strip() == str(rank)
            and first_set(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default="").strip() == str(world))


def _unknown_locality(known: bool, world: int) -> tuple[EnvError, ...]:
    if known or world == 1:
        return ()
    return (EnvError(
        f"RANK and WORLD_SIZE={world} are set but LOCAL_WORLD_SIZE is not, and no srun step says how many ranks run "
        "on this node: each rank takes the GPU of its LOCAL_RANK, and only the ranks on one node up to this one "
        "are known to share its GPUs.",
        "export LOCAL_WORLD_SIZE (ranks per node) with RANK and LOCAL_RANK, or start the ranks with torchrun, srun "
        "or `torchslurm run`."),)


def from_open_mpi(environ: Mapping[str, str], free_port: Callable[[], int]) -> DistEnv | None:
    """mpirun (Open MPI) ranks; under Slurm, mpirun's daemons run as srun tasks, so check first."""
    if "OMPI_COMM_WORLD_RANK" not in environ:
        return None
    prefix = "OMPI_COMM_WORLD_"
    rank = whole_number(prefix + "RANK", environ[prefix + "RANK"])
    world = whole_number(prefix + "SIZE", environ.get(prefix + "SIZE", "1"))
    local_rank = whole_number(prefix + "LOCAL_RANK", environ.get(prefix + "LOCAL_RANK", "0"))
    local_world = whole_number(prefix + "LOCAL_SIZE", environ.get(prefix + "LOCAL_SIZE", "1"))
    check_rank(prefix + "RANK", rank, prefix + "SIZE", world)
    check_rank(prefix + "LOCAL_RANK", local_rank, prefix + "LOCAL_SIZE", local_world)
    nodes = slurm_nodes(environ)
    master = environ.get("MASTER_ADDR") or (nodes[0] if nodes else None)
    if master is None:
        raise EnvError(
            f"mpirun started this process (OMPI_COMM_WORLD_RANK={rank}) but MASTER_ADDR is not set, "
            "and outside Slurm there is no node list to find rank 0's host.",
            "mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<free port> python train.py"
        )
    return DistEnv(
        rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
        node_rank=whole_number(prefix + "NODE_RANK", environ.get(prefix + "NODE_RANK", str(rank // local_world))),
        num_nodes=-(-world // local_world), master_addr=master,
        master_port=master_port(environ, free_port), launcher="mpi", job_id=slurm_job_id(environ),
        reason=f"mpirun (Open MPI) rank {rank} of {world}, master {master}.",
    )


def from_srun(environ: Mapping[str, str]) -> DistEnv | None:
    """A task of an srun step: SLURM_PROCID etc. describe this step (not the whole job)."""
    if "SLURM_STEP_ID" not in environ or "SLURM_PROCID" not in environ:
        return None
    rank = whole_number("SLURM_PROCID", environ["SLURM_PROCID"])
    world = first_number(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default=1)
    local_rank = whole_number("SLURM_LOCALID", environ.get("SLURM_LOCALID", "0"))
    node_rank = whole_number("SLURM_NODEID", environ.get("SLURM_NODEID", "0"))
    check_rank("SLURM_PROCID", rank, "SLURM_STEP_NUM_TASKS", world)
    nodes = slurm_nodes(environ)
    per_node = tasks_per_node(environ, len(nodes))
    num_nodes = len(per_node)
    check_rank("SLURM_NODEID", node_rank, "the number of step nodes", num_nodes)
    if sum(per_node) != world:
        name = "SLURM_STEP_TASKS_PER_NODE" if "SLURM_STEP_TASKS_PER_NODE" in environ else "SLURM_TASKS_PER_NODE"
        raise EnvError(f"{name}={environ[name]!r} adds up to {sum(per_node)} tasks but SLURM_STEP_NUM_TASKS={world}.",
                       SLURM_SETS_THEM)
    local_world = per_node[node_rank]
    check_rank("SLURM_LOCALID", local_rank, "this node's task count", local_world)
    master = environ.get("MASTER_ADDR") or first_node(nodes, num_nodes)
    port = port_number(environ["MASTER_PORT"]) if "MASTER_PORT" in environ else slurm_port(environ)
    store_host, where = _store_placement(environ, nodes, master)
    return DistEnv(
        rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
        node_rank=node_rank, num_nodes=num_nodes, master_addr=master, master_port=port,
        launcher="srun", job_id=slurm_job_id(environ), store_host=store_host,
        reason=f"srun task {rank} of {world} in step {slurm_job_id(environ)}.{environ['SLURM_STEP_ID']} "
               f"on {num_nodes} node(s); {where}.",
    )


def _store_placement(environ: Mapping[str, str], nodes: list[str], master: str) -> tuple[bool | None, str]:
    """Who hosts the store on `master`, and the sentence that says so (a timeout message quotes it)."""
    store_host = hosts_store(environ, nodes, master)
    source = "MASTER_ADDR" if "MASTER_ADDR" in environ else "the step's first node"
    if store_host is None:
        return None, f"rank 0 hosts the store on {master} ({source})"
    return store_host, (f"the store runs on {master} ({source}) in its first task (SLURM_LOCALID=0), "
                        "wherever rank 0 runs")


def from_allocation_shell(environ: Mapping[str, str]) -> DistEnv | None:
    """The sbatch batch shell or an salloc shell: a single process, whatever was allocated."""
    if "SLURM_JOB_ID" not in environ:
        return None
    tasks = whole_number("SLURM_NTASKS", environ.get("SLURM_NTASKS", "1"))
    nodes = first_number(environ, "SLURM_NNODES", "SLURM_JOB_NUM_NODES", default=1)
    warnings: tuple[EnvError, ...] = ()
    if tasks > 1 or nodes > 1:
        warnings = (EnvError(
            f"this Slurm allocation has {tasks} task(s) on {nodes} node(s) (SLURM_NTASKS={tasks}, "
            f"SLURM_NNODES={nodes}) but this process was not started by srun, so it runs alone and "
            "uses one node's resources.", "srun python train.py, or `torchslurm run train.py`, "
            "which starts one rank per allocated task on every node."),
        )
    return DistEnv(
        rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, num_nodes=1,
        master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
        master_port=port_number(environ["MASTER_PORT"]) if "MASTER_PORT" in environ else slurm_port(environ),
        launcher="batch", job_id=slurm_job_id(environ),
        reason=f"inside Slurm job {slurm_job_id(environ)} but not in an srun step (sbatch or salloc shell): "
               "a single process.",
        warnings=warnings,
    )


def local(environ: Mapping[str, str], free_port: Callable[[], int]) -> DistEnv:
    """No launcher at all: one process on this machine."""
    return DistEnv(
        rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, num_nodes=1,
        master_addr=environ.get("MASTER_ADDR", "127.0.0.1"), master_port=master_port(environ, free_port),
        launcher="local", job_id=None,
        reason="no launcher variables (torchrun, srun, mpirun) found: a single local process.",
    )


def _check_exported_rank(environ: Mapping[str, str]) -> None:
    """RANK without the rest of a torchrun environment, inside a Slurm job: neither srun nor sbatch
    sets RANK, so the job script exported it (`export RANK=$SLURM_PROCID` in the batch shell gives
    every srun task the shell's value, 0). Restarting with `torchslurm run` would inherit it too."""
    if "SLURM_JOB_ID" not in environ:
        return
    missing = [n for n in ("WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if n not in environ]
    procid = environ.get("SLURM_PROCID", "")
    # With one rank per srun task RANK must be SLURM_PROCID; a launcher below srun that starts
    # several ranks per task (deepspeed) numbers them its own way, and its world is larger.
    world = environ.get("WORLD_SIZE")
    one_rank_per_task = world is not None and world.strip() == environ.get("SLURM_STEP_NUM_TASKS")
    if ("SLURM_STEP_ID" in environ and is_digits(procid) and procid != environ["RANK"].strip()
            and (missing or one_rank_per_task)):
        seen = f"this srun task has SLURM_PROCID={procid}, so every task inherited the same RANK"
    elif missing:
        seen = f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set"
    else:
        return
    where = "this srun task" if "SLURM_STEP_ID" in environ else "this Slurm batch shell"
    raise EnvError(
        f"RANK={environ['RANK']} is set in {where} but Slurm never sets RANK, and {seen}: the job script "
        "exports RANK (srun hands the batch shell's variables to every task, so all ranks get the same value).",
        "remove the `export RANK=…` line (and any WORLD_SIZE/LOCAL_RANK/MASTER_* exports) from the job script, "
        "or `unset RANK` before srun/`torchslurm run`; torchslurm derives every rank from Slurm (SLURM_PROCID).")


