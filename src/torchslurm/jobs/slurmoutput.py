"""What Slurm's commands print, read: squeue, scontrol show job, sinfo, sbatch --parsable, and the
messages of a client that found no controller. Pure functions of the text; tests feed them outputs
recorded from a real Slurm (tests/fixtures/slurm_output/). The commands themselves run in jobs.slurm.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from torchslurm.errors import SlurmError
from torchslurm.runtime.variables import is_digits

FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                          "BOOT_FAIL", "DEADLINE", "PREEMPTED", "SPECIAL_EXIT", "REVOKED"})
# squeue fields, tab-separated; the job name goes last because it may contain anything but a newline
SQUEUE_FORMAT = "%i\t%T\t%M\t%l\t%D\t%R\t%j"
# keys look like JobId, AllocNode:Sid, ReqB:S:C:T, CPUs/Task; `cpu=4` inside TRES=... has no blank before it
_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_]*(?:[:/][A-Za-z0-9_]+)*)=")
# What Slurm's clients print when no controller answers (wrong or missing SLURM_CONF, slurmctld down).
_UNREACHABLE = ("Could not establish a configuration source", "Unable to process configuration file",
                "Unable to contact slurm controller",
                "Socket timed out", "Connection refused", "Zero Bytes were transmitted")
_JOB_ID = re.compile(r"[0-9]+(?:_(?:[0-9]+|\[[0-9,%-]+\]))?(?:\+[0-9]+)?")


def controller_unreachable(text: str) -> bool:
    """Whether a Slurm client's message says it found no controller (or was not found itself)."""
    return "not found on PATH" in text or any(sign in text for sign in _UNREACHABLE)


def failure_hint(stderr: str) -> str:
    """The HINT for a failed Slurm command, from what it printed."""
    if any(sign in stderr for sign in _UNREACHABLE):
        return ("Slurm's controller cannot be reached from here: check that SLURM_CONF (or /etc/slurm/slurm.conf) "
                "names your cluster and that slurmctld is up (`scontrol ping`); with no cluster, "
                "`torchslurm sandbox up` starts a local one.")
    return "the message above is Slurm's; fix what it names and retry."


def check_job_id(job_id: str) -> str:
    """A Slurm job id as squeue/scontrol/scancel take it: 12345, 12345_7 or 12345_[1-3] (array
    tasks), 12345+1 (a heterogeneous job's component)."""
    if not _JOB_ID.fullmatch(job_id.strip()):
        raise SlurmError(f"job id {job_id!r} is not a Slurm job id: expected digits, e.g. 12345, or 12345_7 for "
                         "an array task.", "`torchslurm status` lists your jobs and their ids.")
    return job_id.strip()


@dataclass(frozen=True)
class JobStatus:
    """Where a job stands, from squeue or (after it left the queue) scontrol."""

    job_id: str
    state: str
    """Slurm's JobState: PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ..."""
    name: str = ""
    reason: str = ""
    """Why it is pending (Resources, Priority, BeginTime, ...) or the node list while running."""
    nodes: str = ""
    exit_code: str = ""
    """`code:signal` as scontrol prints it, e.g. `0:0`; empty while running."""
    elapsed: str = ""
    time_limit: str = ""
    stdout: str = ""
    stderr: str = ""
    restarts: int = 0
    tasks: int = 0
    """Slurm tasks of the job (scontrol's NumTasks; one per rank in srun mode); 0 when not known."""
    excluded: str = ""
    """Its ExcNodeList (--exclude, and nodes a failed attempt excluded: train.badnodes); '' when none."""

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code in ("", "0:0")


@dataclass(frozen=True)
class NodeInfo:
    """One node of a partition as sinfo describes it: what a job's per-node request is held against."""

    name: str
    partition: str
    """The partition, without the `*` sinfo marks the default one with."""
    default: bool
    cpus: int
    gpus: int
    memory_mb: int


# sinfo -N fields, tab-separated: node, partition (`*` = default), CPUs, GRES, memory (MB)
SINFO_FORMAT = "%N\t%P\t%c\t%G\t%m"
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:([0-9]{1,9})")


def gpus_of_gres(gres: str) -> int:
    """GPUs in sinfo's GRES column: `gpu:4`, `gpu:a100:8(S:0-1)`, `gpu:a100:4,gpu:v100:2`; `(null)` is 0."""
    return sum(int(n) for n in _GPU_GRES.findall(gres))


def parse_sinfo_nodes(stdout: str) -> list[NodeInfo]:
    """Rows of `sinfo -h -N -o SINFO_FORMAT` (a node in two partitions has a row in each)."""
    out = []
    for line in stdout.split("\n"):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 5:
            raise SlurmError(f"sinfo printed {line!r}, expected 5 tab-separated fields ({SINFO_FORMAT!r}).",
                             "an SINFO_FORMAT variable may override -o; unset it.")
        name, partition, cpus, gres, memory = parts
        out.append(NodeInfo(name=name, partition=partition.rstrip("*"), default=partition.endswith("*"),
                            cpus=int(cpus) if is_digits(cpus) else 0, gpus=gpus_of_gres(gres),
                            memory_mb=int(memory) if is_digits(memory) else 0))
    return out


# Why a job is pending, in words (squeue(1), "JOB REASON CODES"); a reason not here is shown as Slurm wrote it.
PENDING_REASONS = {
    "Resources": "waiting for nodes to free up: the resources it asks for exist but are in use",
    "Priority": "other jobs with a higher priority are ahead of it in the queue",
    "PartitionConfig": "it asks for more than the partition's nodes or limits allow (GPUs, CPUs, memory, nodes "
                       "or time): it will never start; cancel it and resubmit a smaller request",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows: it will never start as asked",
    "PartitionTimeLimit": "its time limit is longer than the partition's MaxTime: it will never start as asked",
    "PartitionDown": "the partition is down: it starts once an administrator brings it up",
    "PartitionInactive": "the partition is inactive: it starts once an administrator activates it",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "NodeDown": "a node it needs is down",
    "BadConstraints": "no node has the features (--constraint) it asks for: it will never start as asked",
    "Dependency": "it waits for a job it depends on to finish",
    "DependencyNeverSatisfied": "a job it depends on ended in a way that will never satisfy the dependency: "
                                "cancel it",
    "BeginTime": "it was asked to start later (--begin), or was requeued and waits out the requeue delay",
    "JobHeldUser": "held by its owner: `scontrol release JOB` lets it start",
    "JobHeldAdmin": "held by an administrator",
    "launch failed requeued held": "its launch failed and Slurm held it: `scontrol release JOB` retries",
    "QOSMaxJobsPerUserLimit": "you already run as many jobs as your QOS allows; it starts when one ends",
    "QOSMaxGRESPerUser": "you already use as many GPUs as your QOS allows; it starts when some are free",
    "AssocGrpGRES": "your account's GPU limit is reached; it starts when your group's jobs release some",
    "AssocMaxJobsLimit": "your account runs as many jobs as it may; it starts when one ends",
    "InvalidQOS": "the QOS it names is not valid for you: it will never start as asked",
    "InvalidAccount": "the account it names is not valid for you: it will never start as asked",
    "Reservation": "it waits for its advanced reservation to start",
}


def explain_reason(reason: str) -> str:
    """`reason` with what it means for a pending job, e.g. `PartitionConfig (it asks for more ...)`."""
    words = PENDING_REASONS.get(reason.strip())
    return f"{reason} ({words})" if words else reason


def parse_job_id(stdout: str) -> str:
    """`sbatch --parsable` prints `JOBID` or `JOBID;CLUSTER`."""
    text = stdout.strip().split("\n")[-1]
    job_id = text.split(";")[0]
    if not re.fullmatch(r"[0-9]+", job_id):
        raise SlurmError(f"sbatch --parsable printed {stdout.strip()!r}, expected a job id.",
                         "check for a site wrapper around sbatch that prints extra text.")
    return job_id


def parse_squeue(stdout: str) -> list[JobStatus]:
    """Rows of `squeue -h -o SQUEUE_FORMAT`."""
    out = []
    for line in stdout.split("\n"):  # not splitlines: names may hold \x1c-\x1e
        if not line.strip():
            continue
        parts = line.split("\t", 6)
        if len(parts) != 7:
            raise SlurmError(f"squeue printed {line!r}, expected 7 tab-separated fields ({SQUEUE_FORMAT!r}).",
                             "an SQUEUE_FORMAT variable may override -o; unset it.")
        job_id, state, elapsed, limit, nodes, reason, name = parts
        out.append(JobStatus(job_id=job_id, state=state, name=name, reason=reason.strip("()"),
                             nodes=nodes, elapsed=elapsed, time_limit=limit))
    return out


def parse_scontrol(stdout: str) -> dict[str, str]:
    """`scontrol show job -o` (or the multi-line form) as a dict. Values may contain spaces."""
    text = stdout.strip()  # a line break is a blank between keys as a space is
    keys = list(_SCONTROL_KEY.finditer(text))
    fields: dict[str, str] = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(text)
        fields.setdefault(m.group(1), text[m.end():end].strip())
    return fields


def end_time_from_scontrol(fields: Mapping[str, str]) -> float | None:
    """EndTime of `scontrol show job` (local time, as Slurm prints it) as unix seconds; None when
    the job has no end (Unknown, None) or the fields have no EndTime."""
    value = fields.get("EndTime", "")
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def status_from_scontrol(fields: Mapping[str, str]) -> JobStatus:
    if "JobId" not in fields or "JobState" not in fields:
        raise SlurmError(f"scontrol show job printed no JobId/JobState (got keys {sorted(fields)[:8]}).",
                         "run `scontrol show job <id>` yourself to see what it says.")
    return JobStatus(job_id=fields["JobId"], state=fields["JobState"], name=fields.get("JobName", ""),
                     reason=fields.get("Reason", "None"), nodes=fields.get("NodeList", ""),
                     exit_code=fields.get("ExitCode", ""), elapsed=fields.get("RunTime", ""),
                     time_limit=fields.get("TimeLimit", ""), stdout=fields.get("StdOut", ""),
                     stderr=fields.get("StdErr", ""), restarts=_count(fields.get("Restarts")),
                     tasks=_count(fields.get("NumTasks")),
                     excluded="" if fields.get("ExcNodeList", "(null)") == "(null)" else fields["ExcNodeList"])


def _count(value: str | None) -> int:
    """A count scontrol printed; 0 when it printed none, or no number ((null), N/A)."""
    return int(value) if value is not None and is_digits(value) else 0
