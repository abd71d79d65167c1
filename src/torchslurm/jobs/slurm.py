"""The one seam that runs Slurm commands: `run_command`, `run_command_status` and `SlurmClient`
for sbatch / squeue / sinfo / scontrol / scancel, the job commands' and the training's requeue and
deadline. What the commands print is read by jobs.slurmoutput.

Accounting may be off (no slurmdbd, so `sacct` fails):
a job that left the queue is looked up with `scontrol show job`, which keeps finished jobs for
MinJobAge seconds (slurm.conf(5), 300 by default).
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from signal import SIGTERM
from typing import Protocol

from torchslurm.errors import SlurmError
from torchslurm.jobs.slurmoutput import (
    SINFO_FORMAT,
    SQUEUE_FORMAT,
    JobStatus,
    NodeInfo,
    check_job_id,
    end_time_from_scontrol,
    failure_hint,
    parse_job_id,
    parse_scontrol,
    parse_sinfo_nodes,
    parse_squeue,
    status_from_scontrol,
)

logger = logging.getLogger(__name__)

NOT_FOUND = 127
"""`run_command_status`'s return code for a command that could not be started (as a shell says)."""
TIMED_OUT = 124
"""`run_command_status`'s return code for a command killed at its timeout (as timeout(1) says)."""


class CommandRunner(Protocol):
    """How Slurm commands are run: `run_command` or `run_command_status`, or a fake in tests."""

    def __call__(self, argv: Sequence[str], timeout_s: float = ..., cwd: Path | None = ...,
                 env: Mapping[str, str] | None = ...) -> subprocess.CompletedProcess[str]: ...


def run_command(argv: Sequence[str], timeout_s: float = 60, cwd: Path | None = None,
                env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command, its output captured as text; a missing binary or a hang becomes a SlurmError."""
    try:
        return _run(argv, timeout_s, cwd, env)
    except FileNotFoundError as exc:
        raise SlurmError(f"{argv[0]} not found on PATH.", "run this on a Slurm login node, or bring "
                         "up a local cluster with `torchslurm sandbox up` and export its SLURM_CONF.") from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"{' '.join(argv)} did not answer within {timeout_s:g} s.",
                         "check that slurmctld is up (`scontrol ping`).") from exc


def run_command_status(argv: Sequence[str], timeout_s: float = 60, cwd: Path | None = None,
                       env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`run_command` for callers that must not raise (a rank that is stopping): a command that cannot
    be started returns NOT_FOUND, one that hangs TIMED_OUT, with the reason in stderr. In a session of its
    own: torchrun's agent signals its workers' process group, and a `scontrol requeue` must go through."""
    try:
        return _run(argv, timeout_s, cwd, env, new_session=True)
    except OSError as exc:
        return subprocess.CompletedProcess(list(argv), NOT_FOUND, "", f"{argv[0]}: {exc.strerror}")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), TIMED_OUT, "", f"{argv[0]}: no answer within {timeout_s:g} s")


def _run(argv: Sequence[str], timeout_s: float, cwd: Path | None, env: Mapping[str, str] | None,
         new_session: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, cwd=cwd,
                          env=None if env is None else dict(env), stdin=subprocess.DEVNULL, check=False,
                          start_new_session=new_session)


class SlurmClient:
    """sbatch, squeue, sinfo, scontrol and scancel: for the job commands, and for a training job's
    requeue and deadline. Tests pass `run=` a fake."""

    def __init__(self, run: CommandRunner = run_command, environ: Mapping[str, str] | None = None) -> None:
        self._run = run
        self._env = environ

    def _call(self, argv: list[str], timeout_s: float = 60, cwd: Path | None = None,
              check: bool = True) -> subprocess.CompletedProcess[str]:
        logger.debug("running %s", " ".join(argv))
        result = self._run(argv, timeout_s=timeout_s, cwd=cwd, env=self._env)
        if check and result.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}.",
                             failure_hint(result.stderr))
        return result

    def submit(self, script: Path, cwd: Path | None = None) -> str:
        """sbatch --parsable SCRIPT; the job id."""
        return parse_job_id(self._call(["sbatch", "--parsable", str(script)], cwd=cwd).stdout)

    def queue(self, job_id: str | None = None, user: str | None = None) -> list[JobStatus]:
        """squeue rows (pending, running, completing). A job that left the queue gives []."""
        argv = ["squeue", "-h", "-o", SQUEUE_FORMAT]
        if job_id is not None:
            argv += ["-j", check_job_id(job_id)]
        if user is not None:
            argv += ["-u", user]
        result = self._call(argv, check=False)
        if result.returncode != 0:
            if job_id is not None and "Invalid job id" in result.stderr:
                return []
            raise SlurmError(f"squeue failed ({result.returncode}): {result.stderr.strip()}.",
                             failure_hint(result.stderr))
        return parse_squeue(result.stdout)

    def show_job(self, job_id: str, timeout_s: float = 60) -> dict[str, str]:
        """`scontrol show job -o JOB` fields (finished jobs stay visible for MinJobAge)."""
        return self.show_jobs(job_id, timeout_s)[0]

    def show_jobs(self, job_id: str, timeout_s: float = 60, known: bool = True) -> list[dict[str, str]]:
        """Every record of `scontrol show job -o JOB` (one per array task); `known=False`: [] for an unknown job."""
        job_id = check_job_id(job_id)
        result = self._call(["scontrol", "show", "job", "-o", job_id], timeout_s=timeout_s, check=False)
        if result.returncode != 0 and "Invalid job id" in result.stderr and not known:
            return []
        if result.returncode != 0 and "Invalid job id" in result.stderr:
            raise SlurmError(f"job {job_id} is unknown to Slurm: {result.stderr.strip()}.", "it may have finished "
                             "more than MinJobAge ago (`scontrol show config | grep MinJobAge`); its log files are "
                             "still on disk.")
        if result.returncode != 0:
            raise SlurmError(f"scontrol show job {job_id} failed ({result.returncode}): {result.stderr.strip()}.",
                             failure_hint(result.stderr))
        # an array job shows one record per task: one line each with -o, blank-line separated without
        return [parse_scontrol(one) for one in re.split(r"\n(?=JobId=)|\n\s*\n", result.stdout.strip())]

    def status(self, job_id: str) -> JobStatus:
        """scontrol's view (state, exit code, log paths); squeue only answers while queued."""
        return status_from_scontrol(self.show_job(job_id))

    def end_time(self, job_id: str, timeout_s: float = 30) -> float | None:
        """When Slurm will end the job (its EndTime), in unix seconds; None without a time limit."""
        return end_time_from_scontrol(self.show_job(job_id, timeout_s))

    def requeue(self, job_id: str, timeout_s: float = 60) -> None:
        """`scontrol requeue JOB` (JOBID_TASKID for an array task); SlurmError when Slurm refuses."""
        job_id = check_job_id(job_id)
        result = self._call(["scontrol", "requeue", job_id], timeout_s=timeout_s, check=False)
        if result.returncode == -SIGTERM:
            # Slurm ends the job's processes (SIGTERM, "DUE TO JOB REQUEUE") as soon as it accepts the
            # requeue, and scontrol, our child in the same job step, can get that SIGTERM before it exits.
            logger.debug("scontrol requeue %s ended by SIGTERM: Slurm is stopping this run for the requeue", job_id)
            return
        if result.returncode != 0:
            raise SlurmError(
                f"`scontrol requeue {job_id}` failed ({result.returncode}): {result.stderr.strip()}.",
                "submit with --requeue (torchslurm does when preemptible: true), and check that JobRequeue is "
                "not 0 in slurm.conf; the checkpoint is saved, so resubmitting resumes.")

    def exclude_nodes(self, job_id: str, nodes: str, timeout_s: float = 60) -> None:
        """`scontrol update JobId=JOB ExcNodeList=NODES` (a hostlist; the whole list, it replaces the old).
        Slurm takes it only while the job pends (a requeued job does at once); a command killed by the
        SIGTERM of this job's own requeue is run again once."""
        argv = ["scontrol", "update", f"JobId={check_job_id(job_id)}", f"ExcNodeList={nodes}"]
        result = self._call(argv, timeout_s=timeout_s, check=False)
        if result.returncode == -SIGTERM:
            result = self._call(argv, timeout_s=timeout_s, check=False)
        if result.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}.",
                             "Slurm changes ExcNodeList only while the job is pending; `scontrol update "
                             f"JobId={job_id} ExcNodeList=...` by hand before it starts again.")

    def cancel(self, job_id: str, signal: str | None = None) -> JobStatus | None:
        """scancel JOB (or send it `signal`); the job's status before, None for an array range.

        scancel of a job id Slurm does not know prints nothing and exits 0 (Slurm 22.05, seen on
        the sandbox), so the job is looked up first: an unknown id is a SlurmError, not "cancelled"."""
        job_id = check_job_id(job_id)
        before = None if "[" in job_id else self.status(job_id)
        argv = ["scancel", job_id] if signal is None else ["scancel", f"--signal={signal}", job_id]
        self._call(argv)
        return before

    def partition_nodes(self, partition: str | None = None) -> list[NodeInfo] | None:
        """The nodes of `partition` (default: the default partition); [] when there is no such
        partition, None when sinfo cannot answer (then nothing can be said about the request)."""
        argv = ["sinfo", "-h", "-N", "-o", SINFO_FORMAT] + (["-p", partition] if partition else [])
        try:
            result = self._call(argv, check=False)
        except SlurmError as exc:  # no sinfo here: sbatch will say what is wrong
            logger.debug("%s", exc)
            return None
        if result.returncode != 0:
            logger.debug("sinfo failed (%s): %s", result.returncode, result.stderr.strip())
            return None
        nodes = parse_sinfo_nodes(result.stdout)
        return nodes if partition else [n for n in nodes if n.default]

    def version(self) -> str:
        """`sbatch --version`, e.g. `slurm-wlm 22.05.8`."""
        return self._call(["sbatch", "--version"]).stdout.strip()
