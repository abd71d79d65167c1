"""Which run_dir a Slurm job trains into, so that `torchslurm status JOB` can read what the run writes
there (its stragglers). Torch-free.

Slurm knows a job's working directory and log files but not where its Trainer writes. So rank 0 of
a Trainer in a Slurm job leaves a one-line pointer, `run_dir`, in the job's folder
`~/.torchslurm/jobs/<job id>/` (the folder `torchslurm stacks JOB` reads too: runtime.stackwatch),
holding the absolute run_dir: the home directory is what a cluster shares between its login and
compute nodes. A requeued job (same id) rewrites it. Without the pointer (a home directory that is
not shared), `status JOB --run-dir DIR` names it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from torchslurm.errors import SlurmError
from torchslurm.jobs.slurmoutput import check_job_id
from torchslurm.runtime.slurmlayout import slurm_job_id
from torchslurm.runtime.stackwatch import job_dir

POINTER = "run_dir"


def pointer_path(job_id: str, environ: Mapping[str, str]) -> Path | None:
    """Where the pointer of `job_id` lives; None when HOME is not set."""
    home = environ.get("HOME")
    return job_dir(check_job_id(job_id), Path(home)) / POINTER if home else None


def remember(run_dir: Path, environ: Mapping[str, str]) -> Path | None:
    """In a Slurm job (SLURM_JOB_ID, or the array task's id): write the pointer to `run_dir`; the path
    written, or None outside Slurm or where it cannot be written (status then needs --run-dir)."""
    job_id = job_of(environ)
    try:
        path = pointer_path(job_id, environ) if job_id else None
    except SlurmError:  # not an id Slurm gives: nothing to point from
        return None
    if path is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        staging.write_text(str(Path(run_dir).resolve()) + "\n")
        os.replace(staging, path)
    except OSError:
        return None
    return path


def recall(job_id: str, environ: Mapping[str, str]) -> Path | None:
    """The run_dir the job's Trainer wrote its pointer for; None without one."""
    path = pointer_path(job_id, environ)
    try:
        text = path.read_text().strip() if path is not None else ""
    except OSError:
        return None
    return Path(text) if text else None


def job_of(environ: Mapping[str, str]) -> str | None:
    """The id `status` is given for this job: ARRAYJOB_TASK for an array task, else SLURM_JOB_ID."""
    return slurm_job_id(environ) or None
