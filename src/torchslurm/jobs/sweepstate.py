"""A sweep's state: its manifest (`sweep.json`), each point's `outcome.json`, Slurm's view of its
array tasks, and the one decision that turns them into a state per point (docs/sweeps.md).

`point_states` is pure: `torchslurm sweep` resubmits what it calls neither completed, pending nor
running, and `torchslurm results` shows the same words. The effects around it are small and
tolerant where a run may be half-way: `read_outcome` gives None for a missing or unreadable file,
`slurm_tasks` asks `scontrol show job` once per submission (no sacct: accounting may be off; Slurm
keeps finished jobs for MinJobAge seconds, slurm.conf(5)). Torch-free.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torchslurm.errors import ConfigError
from torchslurm.jobs.slurm import SlurmClient
from torchslurm.runtime import safefiles

MANIFEST_FILE = "sweep.json"
MANIFEST_VERSION = 1
OUTCOME_FILE = "outcome.json"
"""Written by the Trainer into every run_dir (train.outcome), sweep or not."""
OUTCOME_STATES = ("completed", "stopped", "failed")

# the states of a point, as `results` shows them
COMPLETED, RUNNING, PENDING, FAILED = "completed", "running", "pending", "failed"
NOT_STARTED, UNKNOWN = "not started", "unknown"
SETTLED = frozenset({COMPLETED, RUNNING, PENDING})
"""States a resubmission leaves alone; every other point is submitted again."""

# Slurm's JobState of a task that is queued or under way (squeue(1), JOB STATE CODES)
_PENDING_SLURM = frozenset({"PENDING", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
_RUNNING_SLURM = frozenset({"RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED", "CONFIGURING", "RESIZING",
                            "SIGNALING", "STAGE_OUT", "STOPPED"})


@dataclass(frozen=True)
class Point:
    """One point of a sweep: array task `index` runs the script with `overrides` in `<sweep_dir>/<dir>`."""

    index: int
    dir: str
    overrides: Mapping[str, Any]


@dataclass(frozen=True)
class Submission:
    """One `sbatch` of the sweep's array: task ids are point indices."""

    job_id: str
    indices: tuple[int, ...]
    time: float
    script: str


@dataclass(frozen=True)
class Manifest:
    """`<sweep_dir>/sweep.json`: the points and every submission of them, oldest first."""

    name: str
    sweep_dir: Path
    points: tuple[Point, ...]
    submissions: tuple[Submission, ...] = ()

    def run_dir(self, point: Point) -> Path:
        return self.sweep_dir / point.dir

    def submitted(self, submission: Submission) -> Manifest:
        return replace(self, submissions=(*self.submissions, submission))

    def to_json(self) -> str:
        data = {"version": MANIFEST_VERSION, "name": self.name, "sweep_dir": str(self.sweep_dir),
                "points": [{"index": p.index, "dir": p.dir, "overrides": dict(p.overrides)} for p in self.points],
                "submissions": [{"job_id": s.job_id, "indices": list(s.indices), "time": s.time, "script": s.script}
                                for s in self.submissions]}
        return json.dumps(data, indent=1) + "\n"  # ASCII: json.dumps escapes the rest


def manifest_from_json(data: Any, source: str = MANIFEST_FILE) -> Manifest:
    """A manifest from its parsed JSON; ConfigError naming `source` when it is not one."""
    try:
        if data.get("version") != MANIFEST_VERSION:
            raise ValueError(f"version {data.get('version')!r}, expected {MANIFEST_VERSION}")
        points = tuple(Point(_int(p["index"]), str(p["dir"]), dict(p["overrides"])) for p in data["points"])
        submissions = tuple(Submission(str(s["job_id"]), tuple(_int(i) for i in s["indices"]), float(s["time"]),
                                       str(s["script"])) for s in data["submissions"])
        manifest = Manifest(str(data["name"]), Path(data["sweep_dir"]), points, submissions)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{source} is not a torchslurm sweep manifest ({type(exc).__name__}: {exc}).",
                          "it is written by `torchslurm sweep`; move it away (or pick another --sweep-name) "
                          "to start the sweep afresh.") from None
    if [p.index for p in points] != list(range(len(points))):
        raise ConfigError(f"{source} lists points {[p.index for p in points][:10]}, expected 0, 1, 2, ... in order.",
                          "it is written by `torchslurm sweep`; do not edit it by hand.")
    return manifest


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an index")
    return value


def read_manifest(sweep_dir: Path) -> Manifest | None:
    """`<sweep_dir>/sweep.json`, or None when there is none; ConfigError when it cannot be read."""
    path = Path(sweep_dir) / MANIFEST_FILE
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}.", "check the folder's permissions.") from None
    try:
        data = json.loads(text)  # UTF-8 (or -16, -32) bytes; bytes that are none of those are not JSON either
    except ValueError as exc:
        raise ConfigError(f"{path} is not JSON ({exc}).", "it is written by `torchslurm sweep` in one piece; "
                          "move it away to start the sweep afresh.") from None
    return manifest_from_json(data, str(path))


def write_manifest(manifest: Manifest) -> Path:
    """Write `sweep.json` whole (readers see the old or the new file), never through a planted link."""
    path = manifest.sweep_dir / MANIFEST_FILE
    safefiles.replace(path, manifest.to_json())
    return path


# -- outcome.json ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    """How a Trainer's fit ended, as its run_dir's outcome.json says (written by train.outcome)."""

    state: str
    """completed | stopped (preemption, time limit, Ctrl-C: a checkpoint was saved) | failed."""
    epochs_done: int
    step: int
    wall_s: float
    """This attempt's time in fit, seconds."""
    time: float
    """When it was written, unix seconds."""
    error: str | None = None
    """The failure in one line (failed only)."""
    rank: int = 0
    """The rank that wrote it."""
    requeued: bool = False
    """stopped only: the job was requeued to go on."""

    def to_json(self) -> str:
        return json.dumps({"state": self.state, "epochs_done": self.epochs_done, "step": self.step,
                           "wall_s": self.wall_s, "time": self.time, "error": self.error, "rank": self.rank,
                           "requeued": self.requeued}) + "\n"


def outcome_from_json(data: Any) -> Outcome | None:
    """An Outcome from parsed JSON; None when it is not one (a file from elsewhere, a newer format)."""
    if not isinstance(data, dict) or data.get("state") not in OUTCOME_STATES:
        return None
    ints = [v for k in ("epochs_done", "step", "rank") if not isinstance(v := data.get(k), bool) and isinstance(v, int)]
    floats = [float(v) for k in ("wall_s", "time")
              if not isinstance(v := data.get(k), bool) and isinstance(v, int | float) and math.isfinite(v)]
    if len(ints) != 3 or len(floats) != 2:
        return None
    error = data.get("error")
    return Outcome(data["state"], ints[0], ints[1], floats[0], floats[1], error if isinstance(error, str) else None,
                   ints[2], data.get("requeued") is True)


def read_outcome(run_dir: Path) -> Outcome | None:
    """`<run_dir>/outcome.json`; None when it is missing, unreadable or not an outcome (never raises)."""
    try:
        return outcome_from_json(json.loads((Path(run_dir) / OUTCOME_FILE).read_bytes()))
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None


def read_outcomes(manifest: Manifest) -> dict[int, Outcome | None]:
    return {p.index: read_outcome(manifest.run_dir(p)) for p in manifest.points}


# -- Slurm's view of the array's tasks ---------------------------------------------------------

@dataclass(frozen=True)
class TaskView:
    """One array task as `scontrol show job` shows it (a pending range is one record per task here)."""

    index: int
    job_id: str
    """`ARRAYJOB_TASK`, the form squeue, scontrol and scancel take."""
    state: str
    reason: str = ""
    exit_code: str = ""
    restarts: int = 0


_TASK_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")


def task_indices(text: str) -> list[int]:
    """`3`, `2-3%2`, `1,4-8:2%3` (ArrayTaskId of a pending range) -> the task ids; [] for anything else."""
    found: list[int] = []
    for part in text.partition("%")[0].split(","):
        m = _TASK_RANGE.fullmatch(part.strip())
        if not m:
            return []
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) else first
        found += range(first, last + 1, int(m.group(3) or 1) or 1)
    return found


def tasks_from_scontrol(records: Sequence[Mapping[str, str]]) -> dict[int, TaskView]:
    """Task index -> its view, from the records of `scontrol show job -o ARRAYJOB` (one per task, one
    per pending range). Records of other jobs (no ArrayJobId) are left out."""
    out: dict[int, TaskView] = {}
    for record in records:
        array = record.get("ArrayJobId", "")
        if not array.isdigit():
            continue
        restarts = record.get("Restarts", "0")
        for index in task_indices(record.get("ArrayTaskId", "")):
            out[index] = TaskView(index, f"{array}_{index}", record.get("JobState", ""), record.get("Reason", ""),
                                  record.get("ExitCode", ""), int(restarts) if restarts.isdigit() else 0)
    return out


def slurm_tasks(manifest: Manifest, client: SlurmClient) -> dict[int, TaskView]:
    """Each point's task in its latest submission Slurm still knows (a later submission wins). A job
    Slurm has forgotten (MinJobAge) adds nothing; SlurmError when Slurm cannot be asked."""
    out: dict[int, TaskView] = {}
    for submission in manifest.submissions:
        found = tasks_from_scontrol(client.show_jobs(submission.job_id, known=False))
        out.update({i: task for i, task in found.items() if i in submission.indices})
    return out


# -- the decision ------------------------------------------------------------------------------

@dataclass(frozen=True)
class PointState:
    """Where one point stands: `state` is one of completed, running, pending, failed, not started,
    unknown; `reason` says why in words (Slurm's reason, the run's error, ...)."""

    index: int
    dir: str
    overrides: Mapping[str, Any]
    state: str
    reason: str = ""
    job: str | None = field(default=None)
    """The point's task in its latest submission (`ARRAYJOB_TASK`), None when never submitted."""


def point_states(manifest: Manifest, outcomes: Mapping[int, Outcome | None],
                 tasks: Mapping[int, TaskView]) -> list[PointState]:
    """Every point's state, Slurm first (a queued or running task), then the run's outcome.json,
    then Slurm's end state; see `point_state`."""
    latest = {i: f"{s.job_id}_{i}" for s in manifest.submissions for i in s.indices}
    return [point_state(p, outcomes.get(p.index), tasks.get(p.index), latest.get(p.index)) for p in manifest.points]


def point_state(point: Point, outcome: Outcome | None, task: TaskView | None, job: str | None) -> PointState:
    """One point: `job` is its task in the latest submission (None: never submitted)."""
    def said(state: str, reason: str) -> PointState:
        return PointState(point.index, point.dir, point.overrides, state, reason, job)

    if task is not None and task.state in _PENDING_SLURM:
        return said(PENDING, "" if task.reason == "None" else task.reason)
    if task is not None and task.state in _RUNNING_SLURM:
        return said(RUNNING, f"restart {task.restarts}" if task.restarts else "")
    if outcome is not None:
        return said(*outcome_state(outcome))
    if task is not None and task.state == "COMPLETED" and task.exit_code in ("", "0:0"):
        return said(COMPLETED, "Slurm: COMPLETED (the script wrote no outcome.json)")
    if task is not None:
        return said(FAILED, f"Slurm: {task.state}" + (f", exit code {task.exit_code}" if task.exit_code else "")
                    + (f" ({task.reason})" if task.reason not in ("", "None") else ""))
    if job is None:
        return said(NOT_STARTED, "never submitted")
    return said(UNKNOWN, f"submitted as {job}, but neither Slurm nor its run_dir knows it (Slurm forgets "
                         "finished jobs after MinJobAge)")


def outcome_state(outcome: Outcome) -> tuple[str, str]:
    """The state and reason of a run that wrote `outcome`, with no queued or running task of it in Slurm."""
    if outcome.state == "completed":
        return COMPLETED, f"{outcome.epochs_done} epoch(s), step {outcome.step}"
    if outcome.state == "failed":
        return FAILED, outcome.error or f"rank {outcome.rank} failed"
    where = f"at epoch {outcome.epochs_done}, step {outcome.step}"  # stopped
    if outcome.requeued:
        return FAILED, f"stopped {where} and requeued, but Slurm has no queued or running task of it"
    return FAILED, f"stopped (preempted or time limit) {where} with no requeue left"


def to_resubmit(states: Sequence[PointState]) -> list[int]:
    """The indices a resubmission sends: every point neither completed, pending nor running."""
    return [s.index for s in states if s.state not in SETTLED]
