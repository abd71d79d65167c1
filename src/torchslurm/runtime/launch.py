"""`torchslurm run`: start the right number of ranks for wherever we are.

- plain machine: N local ranks through torch's elastic launcher (what torchrun uses), with a
  torchrun-compatible environment, so unmodified torchrun-style scripts run too;
- sbatch/salloc shell (no srun yet): re-launch across every allocated node with srun;
- already a rank (srun task, torchrun worker, mpirun): run the script with RANK, WORLD_SIZE,
  MASTER_ADDR, ... filled in from the launcher's own variables.

`plan()` decides from data; `execute()` performs the plan.
"""

from __future__ import annotations

import logging
import os
import signal
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchslurm.errors import ConfigError, DistributedError
from torchslurm.exitcodes import PREEMPTED_EXIT_CODE
from torchslurm.runtime.distenv import DistEnv, detect

logger = logging.getLogger(__name__)

DEFAULT_LOCAL_NPROC = 2
# Signals the local elastic agent forwards to its workers: the usual ones plus the preemption
# signals Slurm sends with --signal (torchrun's default list lacks USR1/USR2).
FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"


@dataclass(frozen=True)
class LaunchPlan:
    """What `execute` will do: exec a rank, srun across the allocation, or spawn local ranks."""

    mode: str
    """'exec' (we are a rank), 'srun' (batch shell → all nodes) or 'local' (N ranks here)."""
    argv: tuple[str, ...]
    """The command to run (for 'local', the command of each rank)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables added to the child's environment."""
    nproc: int = 1
    """Ranks started by this plan on this machine ('local' only)."""
    reason: str = ""
    """One sentence on why this mode was chosen."""


def check_run_options(script: str, nproc: int | None, max_restarts: int) -> None:
    """`torchslurm run`'s flags and script, checked before any rank starts (and for --dry-run)."""
    ConfigError.raise_any([
        None if nproc is None or nproc >= 1 else
        f"--nproc={nproc} must be at least 1. HINT: --nproc 2 starts two ranks.",
        None if max_restarts >= 0 else  # torch's agent divides by zero on one, after the ranks ran
        f"--max-restarts={max_restarts} must be 0 or more. HINT: --max-restarts 0 (the default) fails on the "
        "first error; --max-restarts 3 restarts all ranks up to 3 times.",
        script_problem(script),
    ])


def script_problem(script: str) -> str | None:
    """Why `python script` cannot start, or None: it must be a file (or a folder with __main__.py,
    which python runs too)."""
    path = Path(script)
    if path.is_file() or (path.is_dir() and (path / "__main__.py").is_file()):
        return None
    if path.is_dir():
        seen = "is a directory without __main__.py"
    elif path.exists():
        seen = "is not a regular file"
    else:
        seen = "does not exist"
    return (f"script {script!r} {seen}; expected a Python file. HINT: give the path of the training script, "
            "e.g. `torchslurm run --nproc 2 train.py`.")


def plan(environ: Mapping[str, str], script: str, args: Sequence[str], nproc: int | None,
         python: str, cuda_device_count: int, env: DistEnv | None = None) -> LaunchPlan:
    """Decide how to start `python script args` from the environment alone."""
    if nproc is not None and nproc < 1:
        raise ConfigError(f"--nproc={nproc} must be at least 1. HINT: --nproc 2 starts two ranks.")
    env = env or detect(environ, free_port=lambda: 0)
    command = (python, script, *args)
    if env.launcher in ("srun", "torchrun", "mpi"):
        return LaunchPlan(mode="exec", argv=command, env=env.torchrun_environ(),
                          reason=f"already a rank: {env.reason}")
    if env.launcher == "batch":
        return _srun_plan(environ, script, args, nproc, python)
    count = nproc or cuda_device_count or DEFAULT_LOCAL_NPROC
    why = "--nproc" if nproc else ("one per visible GPU" if cuda_device_count else "default on CPU")
    return LaunchPlan(mode="local", argv=command, nproc=count,
                      reason=f"no launcher found: {count} local rank(s) ({why}).")


def _srun_plan(environ: Mapping[str, str], script: str, args: Sequence[str], nproc: int | None,
               python: str) -> LaunchPlan:
    """From a batch/salloc shell: one srun step across all allocated nodes."""
    nodes = int(environ.get("SLURM_NNODES", environ.get("SLURM_JOB_NUM_NODES", "1")))
    per_node = nproc or gpus_on_node(environ)
    # --export=ALL: a job submitted with --export=NONE makes srun inherit SLURM_EXPORT_ENV=NONE and
    # its tasks start without PATH (execve fails); --kill-on-bad-exit: one dead rank ends the step.
    argv = ["srun", "--export=ALL", "--kill-on-bad-exit=1"]
    if per_node:
        cpus = int(environ.get("SLURM_CPUS_ON_NODE", str(per_node)))
        # Explicit -n and --ntasks-per-node: srun ignores a lone --ntasks-per-node that disagrees
        # with the allocation's task count (slurm-lab.md pitfall 5).
        argv += [f"--nodes={nodes}", f"--ntasks={per_node * nodes}", f"--ntasks-per-node={per_node}",
                 f"--cpus-per-task={max(1, cpus // per_node)}"]
        what = f"{per_node} rank(s) per node on {nodes} node(s)"
    else:
        what = f"one rank per allocated task (SLURM_NTASKS={environ.get('SLURM_NTASKS', '1')})"
    argv += [python, "-m", "torchslurm", "run", script, *args]
    return LaunchPlan(mode="srun", argv=tuple(argv), reason=f"inside a Slurm allocation without srun: {what}.")


def gpus_on_node(environ: Mapping[str, str]) -> int:
    """GPUs this job holds on this node, as Slurm reports them (0 on CPU jobs)."""
    if environ.get("SLURM_GPUS_ON_NODE", "").isdigit():
        return int(environ["SLURM_GPUS_ON_NODE"])
    visible = environ.get("CUDA_VISIBLE_DEVICES", "")
    return len([d for d in visible.split(",") if d.strip()]) if "SLURM_JOB_GPUS" in environ else 0


def execute(launch_plan: LaunchPlan, environ: Mapping[str, str], max_restarts: int = 0) -> int:
    """Carry out the plan. 'exec' and 'srun' replace this process, so signals reach the ranks."""
    logger.debug("launch: %s %s", launch_plan.reason, " ".join(launch_plan.argv))
    if launch_plan.mode == "local":
        return _run_local(launch_plan, environ, max_restarts)
    child_env = {**environ, **launch_plan.env}
    if launch_plan.mode == "exec" and "MASTER_ADDR" in launch_plan.env:
        from torchslurm.runtime import netif

        child_env.update(netif.socket_ifname_env(environ, launch_plan.env["MASTER_ADDR"]))
    try:
        os.execvpe(launch_plan.argv[0], list(launch_plan.argv), child_env)
    except OSError as exc:
        raise ConfigError(f"cannot start {launch_plan.argv[0]!r}: {exc}. HINT: check that it is "
                          "installed and on PATH on every node.") from exc
    raise AssertionError("unreachable: execvpe returned")


def _run_local(launch_plan: LaunchPlan, environ: Mapping[str, str], max_restarts: int) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    check_run_options(launch_plan.argv[1], None, max_restarts)  # also for callers of execute() from Python
    if "OMP_NUM_THREADS" not in environ:
        # Like torchrun: N ranks each spawning one thread per core oversubscribe the machine.
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // launch_plan.nproc))
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=launch_plan.nproc, run_id=str(uuid.uuid4()),
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=max_restarts,
        monitor_interval=0.1, start_method="spawn", signals_to_handle=FORWARDED_SIGNALS,
    )
    try:
        elastic_launch(config, entrypoint=launch_plan.argv[0])(*launch_plan.argv[1:])
    except ChildFailedError as exc:
        raise DistributedError(root_cause_message(exc), exit_code=_first_exit_code(exc)) from exc
    except SignalException as exc:
        raise DistributedError(signal_message(exc.sigval), exit_code=_signal_exit_code(exc.sigval)) from exc
    return 0


def signal_message(sig: signal.Signals) -> str:
    """The launcher got `sig`, forwarded it to the ranks and waited for them (up to 30 s)."""
    return (f"torchslurm run received {sig.name} and passed it on to the ranks; ranks using torchslurm's "
            f"preemption save a checkpoint and exit with code {PREEMPTED_EXIT_CODE}. HINT: run the same "
            "command again to continue from the newest checkpoint (resume=auto).")


def _signal_exit_code(sig: signal.Signals) -> int:
    preempting = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    return PREEMPTED_EXIT_CODE if sig in preempting else 128 + int(sig)


def root_cause_message(exc: object) -> str:
    """The first failing rank first: rank, host, exit code or signal, then the others."""
    failures = sorted(getattr(exc, "failures", {}).items(), key=lambda item: item[1].timestamp)
    if not failures:
        return f"a rank failed: {exc}"
    rank, first = failures[0]
    if first.exitcode == PREEMPTED_EXIT_CODE:
        return (f"rank {rank} (host {os.uname().nodename}) stopped on request with exit code "
                f"{PREEMPTED_EXIT_CODE} (preempted or near the time limit) after saving a checkpoint. "
                "HINT: run the same command again to continue from it (resume=auto).")
    lines = [f"rank {rank} failed first (host {os.uname().nodename}, pid {first.pid}, {_how(first.exitcode)}); "
             "its traceback is above in its output."]
    if first.message and first.message != "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html":
        lines.append(str(first.message).strip())
    others = ", ".join(f"rank {r} ({_how(f.exitcode)})" for r, f in failures[1:])
    if others:
        lines.append(f"then: {others}.")
    lines.append(f"HINT: fix rank {rank}'s error first; the other ranks usually fail because it died.")
    return " ".join(lines)


def _how(exitcode: int) -> str:
    return f"killed by {signal.Signals(-exitcode).name}" if exitcode < 0 else f"exit code {exitcode}"


def _first_exit_code(exc: object) -> int:
    failures = sorted(getattr(exc, "failures", {}).values(), key=lambda f: f.timestamp)
    if not failures:
        return 1
    code = int(failures[0].exitcode)
    return 128 - code if code < 0 else code or 1
