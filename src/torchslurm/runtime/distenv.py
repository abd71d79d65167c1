"""Where this process sits in a distributed job, decided from its environment alone.

`detect(environ)` is a pure function of an environ mapping. Detectors run in priority order:
torchrun (also torchrun inside an srun step: then torchrun's RANK is the truth), Open MPI's
mpirun, an srun task, an sbatch/salloc shell not started by srun, then a plain local process.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from torchslurm import hostlist
from torchslurm.errors import EnvError, HostlistError

LAUNCHERS = ("torchrun", "mpi", "srun", "batch", "local")
LAUNCHER_VARIABLE = "TORCHSLURM_LAUNCHER"
"""Set by `torchslurm run` for a rank it starts with torchrun-style variables derived from another
launcher (an srun task): that launcher's name, so the rank reports srun, not torchrun."""

# Derived ports stay below Linux's ephemeral range (32768-60999 by default), where the kernel
# hands out client ports, and above the well-known/registered-service crowd.
PORT_BASE = 10000
PORT_SPAN = 32768 - PORT_BASE
# Each job gets STEP_SLOTS consecutive ports, one per step id (mod STEP_SLOTS): jobs whose ids
# are less than PORT_SPAN // STEP_SLOTS apart never collide, nor do ids that share their last
# digits (Lightning derives its port from the last 4 digits and collides there).
STEP_SLOTS = 8
# derived_port(job, step 0) as bash arithmetic, for job scripts and hints: a fixed port (torchrun's
# 29500) lets two jobs sharing a node join each other's store. (bash evaluates `*` and `%` left to right.)
RDZV_PORT_EXPR = f"$(({PORT_BASE} + SLURM_JOB_ID * {STEP_SLOTS} % {PORT_SPAN}))"
_WHOLE_NUMBER = re.compile(r"[-+]?[0-9]+")
SLURM_SETS_THEM = "these come from Slurm itself; check that no script exports SLURM_* variables by hand."


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
    """Host that runs rank 0 (the TCPStore server)."""
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
    restart_count: int = 0
    """How often torchrun's agents restarted the workers (TORCHELASTIC_RESTART_COUNT)."""
    max_restarts: int = 0
    """How often torchrun's agents may restart them (`--max-restarts`, TORCHELASTIC_MAX_RESTARTS)."""

    @property
    def restarts_left(self) -> int:
        """Restarts torchrun's agents still have after this run's workers fail (0 outside torchrun)."""
        return max(self.max_restarts - self.restart_count, 0)

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


def find_free_port() -> int:
    """A TCP port that is free on loopback right now (for single-machine runs)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def detect(environ: Mapping[str, str], free_port: Callable[[], int] = find_free_port) -> DistEnv:
    """Decide rank, world size and master of this process from `environ`.

    `free_port` is called only when nothing in the environment fixes the port (local runs).
    Raises EnvError when the environment contradicts itself.
    """
    return (
        from_torchrun(environ)
        or from_open_mpi(environ, free_port)
        or from_srun(environ)
        or from_allocation_shell(environ, free_port)
        or local(environ, free_port)
    )


def derived_port(job_id: str, step_id: str | None) -> int:
    """A port unique to (job, step) on a shared node; see PORT_BASE/STEP_SLOTS."""
    job = _int("SLURM_JOB_ID", job_id)
    step = int(step_id) if step_id and step_id.isascii() and step_id.isdigit() else STEP_SLOTS - 1
    return PORT_BASE + (job * STEP_SLOTS + step % STEP_SLOTS) % PORT_SPAN


def from_torchrun(environ: Mapping[str, str]) -> DistEnv | None:
    """torchrun (or a user) set RANK/WORLD_SIZE; torchrun also sets TORCHELASTIC_RUN_ID."""
    if "RANK" not in environ and "TORCHELASTIC_RUN_ID" not in environ:
        return None
    by_torchrun = "TORCHELASTIC_RUN_ID" in environ
    who = "torchrun" if by_torchrun else "RANK set in the environment"
    if not by_torchrun:
        _check_exported_rank(environ)
    _require(environ, ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"), who,
             "start the script with torchrun or `torchslurm run`, or unset RANK so that "
             "torchslurm derives the placement from Slurm.")
    rank, world = _int("RANK", environ["RANK"]), _int("WORLD_SIZE", environ["WORLD_SIZE"])
    local_rank = _int("LOCAL_RANK", environ["LOCAL_RANK"])
    local_world = _int("LOCAL_WORLD_SIZE", environ.get("LOCAL_WORLD_SIZE", str(world)))
    _check_rank("RANK", rank, "WORLD_SIZE", world)
    _check_rank("LOCAL_RANK", local_rank, "LOCAL_WORLD_SIZE", local_world)
    num_nodes = _int("GROUP_WORLD_SIZE", environ.get("GROUP_WORLD_SIZE", str(-(-world // local_world))))
    node_rank = _int("GROUP_RANK", environ.get("GROUP_RANK", str(rank // local_world)))
    if by_torchrun or "LOCAL_WORLD_SIZE" in environ:  # without it the nodes of another launcher are unknown
        _check_one_group_per_node(environ, world, num_nodes, who)
    launcher = environ.get(LAUNCHER_VARIABLE, "torchrun")
    return DistEnv(
        rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
        node_rank=node_rank, num_nodes=num_nodes, master_addr=environ["MASTER_ADDR"],
        master_port=_port(environ["MASTER_PORT"]), launcher=launcher if launcher in LAUNCHERS else "torchrun",
        job_id=slurm_job_id(environ),
        warnings=_idle_job_nodes(environ, num_nodes) if by_torchrun else (),
        reason=f"{who}: RANK={rank} of WORLD_SIZE={world}, master "
               f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}.",
        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        restart_count=_int("TORCHELASTIC_RESTART_COUNT", environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        max_restarts=_int("TORCHELASTIC_MAX_RESTARTS", environ.get("TORCHELASTIC_MAX_RESTARTS", "0")),
    )


def from_open_mpi(environ: Mapping[str, str], free_port: Callable[[], int]) -> DistEnv | None:
    """mpirun (Open MPI) ranks; under Slurm, mpirun's daemons run as srun tasks, so check first."""
    if "OMPI_COMM_WORLD_RANK" not in environ:
        return None
    prefix = "OMPI_COMM_WORLD_"
    rank = _int(prefix + "RANK", environ[prefix + "RANK"])
    world = _int(prefix + "SIZE", environ.get(prefix + "SIZE", "1"))
    local_rank = _int(prefix + "LOCAL_RANK", environ.get(prefix + "LOCAL_RANK", "0"))
    local_world = _int(prefix + "LOCAL_SIZE", environ.get(prefix + "LOCAL_SIZE", "1"))
    _check_rank(prefix + "RANK", rank, prefix + "SIZE", world)
    _check_rank(prefix + "LOCAL_RANK", local_rank, prefix + "LOCAL_SIZE", local_world)
    nodes = _slurm_nodes(environ)
    master = environ.get("MASTER_ADDR") or (nodes[0] if nodes else None)
    if master is None:
        raise EnvError(
            f"mpirun started this process (OMPI_COMM_WORLD_RANK={rank}) but MASTER_ADDR is not set, "
            "and outside Slurm there is no node list to find rank 0's host.",
            "mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<free port> python train.py"
        )
    return DistEnv(
        rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
        node_rank=_int(prefix + "NODE_RANK", environ.get(prefix + "NODE_RANK", str(rank // local_world))),
        num_nodes=-(-world // local_world), master_addr=master,
        master_port=_master_port(environ, free_port), launcher="mpi", job_id=slurm_job_id(environ),
        reason=f"mpirun (Open MPI) rank {rank} of {world}, master {master}.",
    )


def from_srun(environ: Mapping[str, str]) -> DistEnv | None:
    """A task of an srun step: SLURM_PROCID etc. describe this step (not the whole job)."""
    if "SLURM_STEP_ID" not in environ or "SLURM_PROCID" not in environ:
        return None
    rank = _int("SLURM_PROCID", environ["SLURM_PROCID"])
    world = _int("SLURM_STEP_NUM_TASKS", _first(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default="1"))
    local_rank = _int("SLURM_LOCALID", environ.get("SLURM_LOCALID", "0"))
    node_rank = _int("SLURM_NODEID", environ.get("SLURM_NODEID", "0"))
    _check_rank("SLURM_PROCID", rank, "SLURM_STEP_NUM_TASKS", world)
    nodes = _slurm_nodes(environ)
    per_node = _tasks_per_node(environ, len(nodes))
    num_nodes = len(per_node)
    _check_rank("SLURM_NODEID", node_rank, "the number of step nodes", num_nodes)
    if sum(per_node) != world:
        raise EnvError(
            f"SLURM_STEP_TASKS_PER_NODE={_first(environ, 'SLURM_STEP_TASKS_PER_NODE', 'SLURM_TASKS_PER_NODE')!r} "
            f"adds up to {sum(per_node)} tasks but SLURM_STEP_NUM_TASKS={world}.", SLURM_SETS_THEM
        )
    local_world = per_node[node_rank]
    _check_rank("SLURM_LOCALID", local_rank, "this node's task count", local_world)
    master = environ.get("MASTER_ADDR") or _first_node(nodes, num_nodes)
    port = _port(environ["MASTER_PORT"]) if "MASTER_PORT" in environ else derived_port(
        environ.get("SLURM_JOB_ID", "0"), environ["SLURM_STEP_ID"])
    return DistEnv(
        rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
        node_rank=node_rank, num_nodes=num_nodes, master_addr=master, master_port=port,
        launcher="srun", job_id=slurm_job_id(environ),
        reason=f"srun task {rank} of {world} in step {slurm_job_id(environ)}.{environ['SLURM_STEP_ID']} "
               f"on {num_nodes} node(s); rank 0 runs on {master}.",
    )


def from_allocation_shell(environ: Mapping[str, str], free_port: Callable[[], int]) -> DistEnv | None:
    """The sbatch batch shell or an salloc shell: a single process, whatever was allocated."""
    if "SLURM_JOB_ID" not in environ:
        return None
    tasks = _int("SLURM_NTASKS", environ.get("SLURM_NTASKS", "1"))
    nodes = _int("SLURM_NNODES", _first(environ, "SLURM_NNODES", "SLURM_JOB_NUM_NODES", default="1"))
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
        master_addr=environ.get("MASTER_ADDR", "127.0.0.1"), master_port=_master_port(environ, free_port),
        launcher="batch", job_id=slurm_job_id(environ),
        reason=f"inside Slurm job {slurm_job_id(environ)} but not in an srun step (sbatch or salloc shell): "
               "a single process.",
        warnings=warnings,
    )


def local(environ: Mapping[str, str], free_port: Callable[[], int]) -> DistEnv:
    """No launcher at all: one process on this machine."""
    return DistEnv(
        rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, num_nodes=1,
        master_addr=environ.get("MASTER_ADDR", "127.0.0.1"), master_port=_master_port(environ, free_port),
        launcher="local", job_id=None,
        reason="no launcher variables (torchrun, srun, mpirun) found: a single local process.",
    )


def _slurm_nodes(environ: Mapping[str, str]) -> list[str]:
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


def _first_node(nodes: list[str], num_nodes: int) -> str:
    """The host of rank 0: the step's first node; this host (loopback) for a one-node step without a node list."""
    if nodes:
        return nodes[0]
    if num_nodes == 1:
        return "127.0.0.1"
    raise EnvError(f"srun task of a {num_nodes}-node step without a node list (SLURM_STEP_NODELIST and "
                   "SLURM_JOB_NODELIST unset or empty): cannot tell which host runs rank 0.",
                   "srun sets them in every task; do not clear them in the script, or export "
                   "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) before srun.")


def _tasks_per_node(environ: Mapping[str, str], node_count: int) -> list[int]:
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
    one_rank_per_task = environ.get("WORLD_SIZE", "").strip() == environ.get("SLURM_STEP_NUM_TASKS", "-")
    if ("SLURM_STEP_ID" in environ and procid.isdigit() and procid != environ["RANK"].strip()
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


def _step_node_count(environ: Mapping[str, str]) -> int:
    """Nodes of this srun step (0 outside a step or when Slurm did not say)."""
    if "SLURM_STEP_ID" not in environ:
        return 0
    count = environ.get("SLURM_STEP_NUM_NODES", "")
    if count.isdigit():
        return int(count)
    nodes = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_NODELIST")
    try:
        return len(hostlist.expand(nodes)) if nodes else 0
    except HostlistError:
        return 0


def _check_one_group_per_node(environ: Mapping[str, str], world: int, num_nodes: int, who: str) -> None:
    """A launcher's world must span the srun step that started it: `srun -N2 torchrun --standalone`
    (or --nnodes=1, or any launcher told of one node) starts one independent group per node, and
    each trains the whole model alone into the same run_dir."""
    step_nodes = _step_node_count(environ)
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


def _idle_job_nodes(environ: Mapping[str, str], num_nodes: int) -> tuple[EnvError, ...]:
    """torchrun started in the batch shell of a multi-node job (not under srun) uses one node."""
    job_nodes = environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", ""))
    if "SLURM_STEP_ID" in environ or not job_nodes.isdigit() or int(job_nodes) <= num_nodes:
        return ()
    return (EnvError(
        f"this Slurm job has {job_nodes} nodes (SLURM_JOB_NUM_NODES={job_nodes}) but torchrun, started without "
        f"srun, spans {num_nodes}: the other nodes stay idle.",
        f"srun --ntasks-per-node=1 torchrun --nnodes={job_nodes} --rdzv-backend=c10d --rdzv-endpoint=<first "
        f"node>:{RDZV_PORT_EXPR} train.py, or `torchslurm run train.py`."),)


def _require(environ: Mapping[str, str], names: tuple[str, ...], who: str, hint: str) -> None:
    missing = [n for n in names if n not in environ]
    if missing:
        present = ", ".join(f"{n}={environ[n]}" for n in names if n in environ) or "none of them"
        raise EnvError(f"{who}, but {', '.join(missing)} not set ({present}): half a torchrun environment.", hint)


def _check_rank(name: str, value: int, size_name: str, size: int) -> None:
    if size < 1:
        raise EnvError(f"{size_name}={size} must be at least 1.", "check the launcher's arguments.")
    if not 0 <= value < size:
        raise EnvError(
            f"{name}={value} is outside 0..{size - 1} ({size_name}={size}).",
            "the launcher's variables disagree; do not set rank variables by hand in job scripts."
        )


def _int(name: str, value: str) -> int:
    """A whole number as Slurm and torchrun write one: ASCII digits, optionally signed. Python's int() would
    also take `12_0` (as 120) and non-ASCII digits, which would silently name another job or rank."""
    text = value.strip()
    if _WHOLE_NUMBER.fullmatch(text) is None:
        raise EnvError(f"{name}={value!r} is not an integer.", f"unset {name} or set it to a whole number.")
    return int(text)


def _port(value: str) -> int:
    port = _int("MASTER_PORT", value)
    if not 1 <= port <= 65535:
        raise EnvError(f"MASTER_PORT={port} is not a TCP port (1-65535).",
                       "unset MASTER_PORT to let torchslurm derive a job-unique port.")
    return port


def _master_port(environ: Mapping[str, str], free_port: Callable[[], int]) -> int:
    if "MASTER_PORT" in environ:
        return _port(environ["MASTER_PORT"])
    if "SLURM_JOB_ID" in environ:
        return derived_port(environ["SLURM_JOB_ID"], environ.get("SLURM_STEP_ID"))
    return free_port()


def slurm_job_id(environ: Mapping[str, str]) -> str | None:
    """SLURM_JOB_ID, or ARRAYJOBID_TASKID for an array task (the form scontrol and squeue accept)."""
    if "SLURM_ARRAY_JOB_ID" in environ and "SLURM_ARRAY_TASK_ID" in environ:
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ.get("SLURM_JOB_ID")


def _first(environ: Mapping[str, str], *names: str, default: str | None = None) -> str:
    for name in names:
        if name in environ:
            return environ[name]
    if default is None:
        raise EnvError(f"none of {', '.join(names)} is set.",
                       "srun sets them in every task; start the program with srun, not with a partial copy "
                       "of a Slurm environment.")
    return default
