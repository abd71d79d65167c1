"""Requeue: when the job ends (its time limit), which job to requeue (array tasks included), whether
rank 0 requeues after a stop or a peer failure, and a requeue that leaves bad nodes out
(train.badnodes). The decisions are pure functions of the environ; the Slurm commands (`scontrol
requeue`, `scontrol show job`'s EndTime, `scontrol update ... ExcNodeList`) are
jobs.slurm.SlurmClient's, run through a Runner (default: jobs.slurm.run_command_status, which never
raises: a stopping rank logs a failed command instead) or a SlurmClient given as it is."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from torchslurm.errors import ConfigError, SlurmError, TorchSlurmError
from torchslurm.hostlist import compress
from torchslurm.jobs.slurm import SlurmClient, run_command_status
from torchslurm.runtime.slurmlayout import slurm_job_id
from torchslurm.runtime.variables import is_digits
from torchslurm.train.badnodes import NodeFault, job_nodes, plan_exclusion

if TYPE_CHECKING:
    from torchslurm.runtime.distenv import DistEnv

logger = logging.getLogger(__name__)

Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]
"""`run(argv, timeout_s)`: a Slurm command's result, never an exception (tests pass a recorder)."""


def slurm_client(run: Runner | SlurmClient) -> SlurmClient:
    """The client that runs scontrol: `run` itself when it is one, else one over the Runner."""
    if isinstance(run, SlurmClient):
        return run

    def positional(argv: Sequence[str], timeout_s: float = 60, cwd: Path | None = None,
                   env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return run(argv, timeout_s)  # scontrol needs neither a folder nor an environment of its own

    return SlurmClient(run=positional)


def job_end_time(environ: Mapping[str, str], run: Runner | SlurmClient | None = None) -> float | None:
    """When Slurm will end this job, in unix seconds; None outside Slurm or without a time limit.
    TORCHSLURM_END_TIME, then SLURM_JOB_END_TIME, then (with `run`) `scontrol show job`'s EndTime."""
    for name in ("TORCHSLURM_END_TIME", "SLURM_JOB_END_TIME"):
        text = environ.get(name, "").strip()
        if text:
            try:
                return float(text)
            except ValueError:
                raise ConfigError(f"{name}={text!r} is not unix seconds.",
                                  f"e.g. {name}={int(time.time()) + 3600}, or unset it.") from None
    job = requeue_target(environ)
    if run is None or job is None:
        return None
    try:
        return slurm_client(run).end_time(job)
    except SlurmError as exc:
        logger.warning("no deadline: %s", exc)
        return None


def requeue_target(environ: Mapping[str, str]) -> str | None:
    """What `scontrol requeue` needs: JOBID, or ARRAYJOBID_TASKID for an array task (requeueing
    SLURM_JOB_ID of an array task works too, but the array form is what squeue shows)."""
    return slurm_job_id(environ) or None


@dataclass(frozen=True)
class RequeuePlan:
    """Whether rank 0 requeues the job after a stop, and why (for the log)."""

    target: str | None
    """The job to requeue, or None to only exit."""
    reason: str


def plan_requeue(environ: Mapping[str, str], max_requeues: int, wanted: bool) -> RequeuePlan:
    """Decide from data: requeue only in a Slurm job, when the stop asks for it, within budget."""
    target = requeue_target(environ)
    restarts_text = environ.get("SLURM_RESTART_COUNT") or "0"
    if not is_digits(restarts_text):
        raise ConfigError(f"SLURM_RESTART_COUNT={restarts_text!r} is not a count.",
                          "Slurm sets it; unset it when running outside Slurm.")
    restarts = int(restarts_text)
    if target is None:
        return RequeuePlan(None, "not a Slurm job (no SLURM_JOB_ID): nothing to requeue")
    if not wanted:
        return RequeuePlan(None, "stopped by SIGTERM (scancel, time limit or Slurm's own preemption): "
                                 "Slurm decides whether the job comes back")
    if restarts >= max_requeues:
        return RequeuePlan(None, f"SLURM_RESTART_COUNT={restarts} has reached max_requeues={max_requeues}")
    return RequeuePlan(target, f"restart {restarts + 1} of at most {max_requeues}")


def requeues_after_failure(env: DistEnv) -> bool:
    """Whether this rank requeues the job when a peer failed: local rank 0 of each node (Slurm
    takes the first requeue), under srun, and under torchrun only once its agents have no
    restarts left; until then they restart the workers, which resume from the last checkpoint."""
    if env.local_rank != 0:
        return False
    return env.launcher == "srun" or (env.launcher == "torchrun" and env.restarts_left == 0)


def requeue(plan: RequeuePlan, run: Runner | SlurmClient = run_command_status, timeout_s: float = 60.0) -> None:
    """Requeue `plan.target` through SlurmClient.requeue (nothing when the plan says no); raises
    SlurmError when Slurm refuses (or does not answer in time)."""
    if plan.target is not None:
        slurm_client(run).requeue(plan.target, timeout_s)


def requeue_excluding(environ: Mapping[str, str], faults: Sequence[NodeFault], max_requeues: int,
                      max_excluded: int, run: Runner | SlurmClient = run_command_status,
                      timeout_s: float = 5.0) -> str:
    """Requeue the job (within max_requeues) with the faulty nodes in its ExcNodeList, as far as
    plan_exclusion allows; the log line. The job and its partition are read first: once requeued,
    Slurm sends this job's processes SIGTERM, which may kill a command under way. Slurm takes
    ExcNodeList only from a pending job, hence the order: requeue (or someone else did), then update.
    Raises SlurmError when Slurm cannot be asked or refuses the update."""
    plan = plan_requeue(environ, max_requeues, wanted=True)
    if plan.target is None:
        return f"excluded no node ({', '.join(f.reason for f in faults)}): not requeued, {plan.reason}"
    client = slurm_client(run)
    try:
        job = job_nodes(client.show_job(plan.target, timeout_s))
    except TorchSlurmError as exc:  # SlurmError, or HostlistError for a list we cannot read
        raise SlurmError(f"cannot read job {plan.target}'s nodes to exclude {faults[0].node}: {exc.message}",
                         exc.hint) from exc
    listed = client.partition_nodes(",".join(job.partitions) or None)
    exclusion = plan_exclusion(faults, job, None if listed is None else [n.name for n in listed], max_excluded)
    try:
        requeue(plan, client, timeout_s)
    except SlurmError as exc:  # a peer requeued first: the job pends all the same
        logger.debug("requeue before excluding nodes: %s", exc)
    if exclusion.exclude:
        client.exclude_nodes(plan.target, compress(exclusion.exclude), timeout_s)
    return f"{exclusion.message} (job {plan.target}, {plan.reason})"
