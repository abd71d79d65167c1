"""`torchslurm run`: start the right number of ranks for wherever we are.

- plain machine: N local ranks through torch's elastic launcher (what torchrun uses), with a
  torchrun-compatible environment, so unmodified torchrun-style scripts run too;
- sbatch/salloc shell (no srun yet): re-launch across every allocated node with srun;
- already a rank (srun task, torchrun worker, mpirun): run the script with RANK, WORLD_SIZE,
  MASTER_ADDR, ... filled in from the launcher's own variables.

Each rank runs `python script args`, or `python -m module args` when `module=True` (how
torchslurm's own rank programs start: by module name, so nothing depends on their file's place).
`plan()` decides from data; `execute()` performs the plan.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchslurm.errors import ConfigError, DistributedError
from torchslurm.exitcodes import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE
from torchslurm.runtime.devices import container, cpu_oversubscription, omp_threads, usable_cpus
from torchslurm.runtime.distenv import LAUNCHER_VARIABLE, DistEnv, detect
from torchslurm.runtime.runchecks import check_run_options, nproc_problem
from torchslurm.runtime.variables import is_digits

logger = logging.getLogger(__name__)

DEFAULT_LOCAL_NPROC = 2
AGENT_MODULE = "torchslurm.cli.agent"
"""What torchrun-mode job scripts run on each node (`python -m`): torchrun's agent with an end that fits
a stop on request (docs/checkpoints.md); it takes torch.distributed.run's options."""
# Signals the local elastic agent forwards to its workers: the usual ones plus the preemption
# signals Slurm sends with --signal (torchrun's default list lacks USR1/USR2).
FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
FINISHED_VARIABLE = "TORCHSLURM_FINISHED_DIR"
"""Set by `torchslurm run` for its local ranks: a folder where each rank leaves a file once its
training has finished (`mark_finished`), so that a signal after the end is not reported as a stop."""
# Each local rank starts as `python -S -c DIE_WITH_LAUNCHER <launcher pid> <finished dir> python script
# args`: it asks the kernel for SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG = 1, man 2 prctl;
# kept across execve), then becomes the rank (-S: no site-packages to set up for a few lines of the
# standard library, some ms less before each rank's own interpreter starts). The elastic agent starts
# ranks in sessions of their own, so a launcher killed with SIGKILL would otherwise leave them training.
# If the launcher died before the prctl, the parent is no longer the launcher: exit at once.
DIE_WITH_LAUNCHER = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 9, 0, 0, 0); "
                     "os.getppid() == int(sys.argv[1]) or os._exit(137); "
                     f"os.environ['{FINISHED_VARIABLE}'] = sys.argv[2]; os.execvp(sys.argv[3], sys.argv[3:])")


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
    script: str = ""
    """What each rank runs: a script path, or a module name when `module`."""
    module: bool = False
    """Ranks run `python -m script` instead of `python script`."""


def cuda_device_count(environ: Mapping[str, str] = os.environ, device_node: str = "/dev/nvidiactl") -> int:
    """Visible GPUs, without importing torch when CUDA cannot be there (a CPU node, a login node).
    0 where torch is not installed (a GPU login node): whatever the ranks need, planning needs no torch."""
    if environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1") or not os.path.exists(device_node):
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count())


def plan(environ: Mapping[str, str], script: str, args: Sequence[str], nproc: int | None,
         python: str, cuda_device_count: int, env: DistEnv | None = None, *, module: bool = False) -> LaunchPlan:
    """Decide how to start `python script args` (`python -m script args` when `module`) from the
    environment alone."""
    ConfigError.raise_any([nproc_problem(nproc)])
    env = env or detect(environ, free_port=lambda: 0)
    command = (python, *(["-m"] if module else []), script, *args)
    if env.launcher in ("srun", "torchrun", "mpi"):
        return LaunchPlan(mode="exec", argv=command, env={**env.torchrun_environ(), LAUNCHER_VARIABLE: env.launcher},
                          reason=f"already a rank: {env.reason}", script=script, module=module)
    if env.launcher == "batch":
        return _srun_plan(environ, script, args, nproc, python, module)
    count = nproc or cuda_device_count or DEFAULT_LOCAL_NPROC
    why = "--nproc" if nproc else ("one per visible GPU" if cuda_device_count else "default on CPU")
    return LaunchPlan(mode="local", argv=command, nproc=count,
                      reason=f"no launcher found: {count} local rank(s) ({why}).", script=script, module=module)


def _srun_plan(environ: Mapping[str, str], script: str, args: Sequence[str], nproc: int | None,
               python: str, module: bool) -> LaunchPlan:
    """From a batch/salloc shell: one srun step across all allocated nodes."""
    nodes = int(environ.get("SLURM_NNODES", environ.get("SLURM_JOB_NUM_NODES", "1")))
    per_node = nproc or gpus_on_node(environ)
    # --export=ALL: a job submitted with --export=NONE makes srun inherit SLURM_EXPORT_ENV=NONE and
    # its tasks start without PATH (execve fails); --kill-on-bad-exit: one dead rank ends the step.
    argv = ["srun", "--export=ALL", "--kill-on-bad-exit=1"]
    if per_node:
        cpus = int(environ.get("SLURM_CPUS_ON_NODE", str(per_node)))
        # Explicit -n and --ntasks-per-node: inside an allocation srun takes its task count from
        # SLURM_NTASKS and ignores a lone --ntasks-per-node that disagrees with it (man srun, -n).
        argv += [f"--nodes={nodes}", f"--ntasks={per_node * nodes}", f"--ntasks-per-node={per_node}",
                 f"--cpus-per-task={max(1, cpus // per_node)}"]
        what = f"{per_node} rank(s) per node on {nodes} node(s)"
    else:
        what = f"one rank per allocated task (SLURM_NTASKS={environ.get('SLURM_NTASKS', '1')})"
    argv += [python, "-m", "torchslurm", "run", *(["-m"] if module else []), script, *args]
    return LaunchPlan(mode="srun", argv=tuple(argv), reason=f"inside a Slurm allocation without srun: {what}.",
                      script=script, module=module)


def gpus_on_node(environ: Mapping[str, str]) -> int:
    """GPUs this job holds on this node, as Slurm reports them (0 on CPU jobs)."""
    if is_digits(environ.get("SLURM_GPUS_ON_NODE", "")):
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
        raise cannot_start(launch_plan.argv[0], exc, environ) from exc
    raise AssertionError("unreachable: execvpe returned")


def cannot_start(program: str, error: OSError, environ: Mapping[str, str]) -> ConfigError:
    """The error of a rank or srun step that could not be started. srun missing inside an Apptainer or
    Singularity container (images rarely hold Slurm's commands) means srun belongs outside it."""
    inside = container(environ)
    why = error.strerror or str(error)  # not str(error): execvpe's names the last folder of PATH it tried
    if program == "srun" and inside is not None:
        return ConfigError(f"cannot start 'srun' inside the container {inside[1]}: {why}.",
                           "start the ranks from outside it, one container per task: `srun apptainer exec --nv "
                           "IMAGE torchslurm run train.py` in the batch script (each task then runs as one rank).")
    return ConfigError(f"cannot start {program!r}: {why}.", "check that it is installed and on PATH on every node.")


def _run_local(launch_plan: LaunchPlan, environ: Mapping[str, str], max_restarts: int) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # also for callers of execute() from Python
    check_run_options(launch_plan.script or launch_plan.argv[1], None, max_restarts, module=launch_plan.module)
    cpus = usable_cpus()
    if warning := cpu_oversubscription(environ, launch_plan.nproc, cpus):
        logger.warning("%s", warning)
    if (threads := omp_threads(environ, launch_plan.nproc, cpus)) is not None:
        os.environ["OMP_NUM_THREADS"] = threads
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=launch_plan.nproc, run_id=str(uuid.uuid4()),
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=max_restarts,
        monitor_interval=0.1, start_method="spawn", signals_to_handle=FORWARDED_SIGNALS,
    )
    # the agent's handlers raise SignalException wherever this process is: theirs only while it runs
    main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in _forwarded()} if main else {}
    with tempfile.TemporaryDirectory(prefix="torchslurm-run-") as finished:
        entrypoint, args = launch_plan.argv[0], launch_plan.argv[1:]
        if sys.platform == "linux":
            entrypoint, args = sys.executable, ("-S", "-c", DIE_WITH_LAUNCHER, str(os.getpid()), finished,
                                                *launch_plan.argv)
        try:
            elastic_launch(config, entrypoint=entrypoint)(*args)
        except ChildFailedError as exc:
            raise root_cause(exc) from exc
        except SignalException as exc:
            if len(list(Path(finished).iterdir())) < launch_plan.nproc:
                raise signal_error(exc.sigval) from exc
            logger.warning("%s came after every rank had finished training: nothing was left to stop or save.",
                           exc.sigval.name)
            return 128 + int(exc.sigval)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    return 0


def _forwarded() -> list[signal.Signals]:
    return [signal.Signals[name] for name in FORWARDED_SIGNALS.split(",")]


def mark_finished(environ: Mapping[str, str], rank: int) -> None:
    """This rank's training has finished: say so to the `torchslurm run` that started it (nothing
    elsewhere), so that a Ctrl-C from now on is not reported as a stop with a checkpoint to come."""
    folder = environ.get(FINISHED_VARIABLE)
    if folder:
        with contextlib.suppress(OSError):  # the launcher gone: nobody to tell
            (Path(folder) / f"rank-{rank}").touch()


def signal_error(sig: signal.Signals) -> DistributedError:
    """The launcher got `sig`, forwarded it to the ranks and waited for them (up to 30 s)."""
    if sig == signal.SIGINT:
        return DistributedError(
            "torchslurm run got Ctrl-C (SIGINT) and passed it on to the ranks; ranks using torchslurm's Trainer "
            f"stop at the next step boundary, save a checkpoint and exit with code {INTERRUPTED_EXIT_CODE} "
            "(a second Ctrl-C stops them at once).",
            "run the same command again to continue from the newest checkpoint (resume=auto).",
            exit_code=INTERRUPTED_EXIT_CODE)
    return DistributedError(
        f"torchslurm run received {sig.name} and passed it on to the ranks; ranks using torchslurm's "
        f"preemption save a checkpoint and exit with code {PREEMPTED_EXIT_CODE}.",
        "run the same command again to continue from the newest checkpoint (resume=auto).",
        exit_code=signal_exit_code(sig))


def signal_exit_code(sig: signal.Signals) -> int:
    """A launcher's exit code after it passed `sig` on to its ranks: PREEMPTED_EXIT_CODE for the
    signals that ask for a stop (SIGTERM, the warning signals), else 128 + N, as a shell reports it."""
    preempting = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    return PREEMPTED_EXIT_CODE if sig in preempting else 128 + int(sig)


def root_cause(exc: object) -> DistributedError:
    """The first failing rank first: rank, host, exit code or signal, then the others; the
    launcher exits with that rank's code."""
    failures = sorted(getattr(exc, "failures", {}).items(), key=lambda item: item[1].timestamp)
    if not failures:
        return DistributedError(f"a rank failed: {exc}", exit_code=1)
    rank, first = failures[0]
    exit_code = _exit_code(int(first.exitcode))
    if first.exitcode == PREEMPTED_EXIT_CODE:
        return DistributedError(
            f"rank {rank} (host {os.uname().nodename}) stopped on request with exit code {PREEMPTED_EXIT_CODE} "
            "(preempted or near the time limit) after saving a checkpoint.",
            "run the same command again to continue from it (resume=auto).", exit_code=exit_code)
    if first.exitcode == INTERRUPTED_EXIT_CODE:
        return DistributedError(
            f"rank {rank} (host {os.uname().nodename}) stopped on Ctrl-C with exit code {INTERRUPTED_EXIT_CODE}.",
            "ranks using torchslurm's Trainer saved a checkpoint first: run the same command again to continue "
            "from it (resume=auto).", exit_code=exit_code)
    lines = [f"rank {rank} failed first (host {os.uname().nodename}, pid {first.pid}, {_how(first.exitcode)}); "
             + ("a killed process leaves no traceback: look for the out-of-memory killer (`dmesg`, the job's "
                "memory limit) or who sent the signal." if first.exitcode < 0 else "its error is above in its output.")]
    if first.message and first.message != "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html":
        lines.append(str(first.message).strip())
    others = ", ".join(f"rank {r} ({_how(f.exitcode)})" for r, f in failures[1:])
    if others:
        lines.append(f"then: {others}.")
    return DistributedError(" ".join(lines), f"fix rank {rank}'s error first; the other ranks usually fail "
                            "because it died.", exit_code=exit_code)


def _how(exitcode: int) -> str:
    return f"killed by {signal.Signals(-exitcode).name}" if exitcode < 0 else f"exit code {exitcode}"


def _exit_code(rank_exitcode: int) -> int:
    """A rank killed by signal N (elastic reports -N) exits the launcher with 128 + N, as a shell would."""
    return 128 - rank_exitcode if rank_exitcode < 0 else rank_exitcode or 1
