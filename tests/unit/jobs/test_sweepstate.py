"""A sweep's state: the manifest and outcome.json read and written, Slurm's records of an array
(recorded from the sandbox's Slurm 22.05.8: tests/fixtures/slurm_output/scontrol_array_*.txt), and
the one decision per point that `sweep` (what to resubmit) and `results` share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.unit.jobs.conftest import FakeRun, fixture

from torchslurm.errors import ConfigError, TorchSlurmError
from torchslurm.jobs.slurm import SlurmClient
from torchslurm.jobs.slurmoutput import parse_scontrol
from torchslurm.jobs.sweepstate import (
    MANIFEST_FILE,
    OUTCOME_FILE,
    Manifest,
    Outcome,
    Point,
    PointState,
    Submission,
    TaskView,
    outcome_from_json,
    point_states,
    read_manifest,
    read_outcome,
    read_outcomes,
    slurm_tasks,
    task_indices,
    tasks_from_scontrol,
    to_resubmit,
    write_manifest,
)


def manifest(tmp_path: Path, points: int = 4, submissions: tuple[Submission, ...] = ()) -> Manifest:
    return Manifest("lr", tmp_path, tuple(Point(i, f"{i}-lr={i}", {"lr": i}) for i in range(points)), submissions)


def test_the_manifest_is_written_whole_and_read_back(tmp_path: Path) -> None:
    first = manifest(tmp_path, submissions=(Submission("11", (0, 1, 2, 3), 1.5, "/x/lr.sbatch"),))
    path = write_manifest(first)
    assert path == tmp_path / MANIFEST_FILE
    data = json.loads(path.read_text())
    assert data["version"] == 1 and data["points"][1] == {"index": 1, "dir": "1-lr=1", "overrides": {"lr": 1}}
    assert data["submissions"] == [{"job_id": "11", "indices": [0, 1, 2, 3], "time": 1.5, "script": "/x/lr.sbatch"}]
    second = first.submitted(Submission("12", (3,), 2.0, "/x/lr-2.sbatch"))
    write_manifest(second)
    assert read_manifest(tmp_path) == second
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_FILE]  # no staging file left behind


def test_no_manifest_is_none_and_a_broken_one_is_said(tmp_path: Path) -> None:
    assert read_manifest(tmp_path) is None
    (tmp_path / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match=r"sweep.json is not JSON .*HINT: .*move it away"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"version": 1, "name": "x", "sweep_dir": "/x",
                                                      "points": [{"index": "0", "dir": "d", "overrides": {}}],
                                                      "submissions": []}))
    with pytest.raises(ConfigError, match=r"is not a torchslurm sweep manifest \(ValueError: '0' is not an index"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"version": 2}))
    with pytest.raises(ConfigError, match=r"version 2, expected 1"):
        read_manifest(tmp_path)


def test_a_manifest_through_a_planted_link_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / MANIFEST_FILE).symlink_to(target)
    write_manifest(manifest(tmp_path))  # rename(2) replaces the link itself
    assert target.read_text() == "keep" and not (tmp_path / MANIFEST_FILE).is_symlink()


def test_outcome_json_is_read_tolerantly(tmp_path: Path) -> None:
    assert read_outcome(tmp_path) is None
    done = Outcome("completed", 2, 90, 12.5, 1700000000.0, None, 0, False)
    (tmp_path / OUTCOME_FILE).write_text(done.to_json())
    assert read_outcome(tmp_path) == done
    for broken in ("", "{", "[]", '{"state": "won"}', json.dumps({**json.loads(done.to_json()), "step": "9"}),
                   json.dumps({**json.loads(done.to_json()), "wall_s": True})):
        (tmp_path / OUTCOME_FILE).write_text(broken)
        assert read_outcome(tmp_path) is None, broken
    (tmp_path / OUTCOME_FILE).write_bytes(b"\xff\xfe")
    assert read_outcome(tmp_path) is None
    (tmp_path / OUTCOME_FILE).unlink()
    (tmp_path / OUTCOME_FILE).mkdir()  # a folder in its place: unreadable, not an error
    assert read_outcome(tmp_path) is None
    assert outcome_from_json({**json.loads(done.to_json()), "error": 3}) == done  # a non-text error is dropped


def test_task_indices_of_pending_ranges() -> None:
    assert task_indices("3") == [3]
    assert task_indices("2-3%2") == [2, 3]
    assert task_indices("1,4-8:2%3") == [1, 4, 6, 8]
    assert task_indices("") == [] and task_indices("x") == [] and task_indices("4294967294") == [4294967294]


def test_tasks_from_scontrol_of_a_running_array() -> None:
    tasks = tasks_from_scontrol([parse_scontrol(line) for line in fixture("scontrol_array_running.txt").splitlines()])
    assert {i: (t.job_id, t.state, t.reason) for i, t in tasks.items()} == {
        0: ("11_0", "RUNNING", "None"), 1: ("11_1", "RUNNING", "None"),
        2: ("11_2", "PENDING", "JobArrayTaskLimit"), 3: ("11_3", "PENDING", "JobArrayTaskLimit")}


def test_slurm_tasks_asks_once_per_submission_and_the_latest_wins(tmp_path: Path) -> None:
    run = FakeRun({"scontrol": (0, fixture("scontrol_array_finished.txt"), "")})
    sweep = manifest(tmp_path, submissions=(Submission("4", (0, 1, 2, 3), 1.0, "s"),
                                            Submission("4", (3,), 2.0, "s2")))
    tasks = slurm_tasks(sweep, SlurmClient(run=run))
    assert run.calls == [["scontrol", "show", "job", "-o", "4"]] * 2
    assert (tasks[3].state, tasks[3].exit_code, tasks[3].reason) == ("FAILED", "3:0", "NonZeroExitCode")
    assert [tasks[i].state for i in (0, 1, 2)] == ["COMPLETED"] * 3
    gone = FakeRun({"scontrol": (1, "", "slurm_load_jobs error: Invalid job id specified\n")})
    assert slurm_tasks(sweep, SlurmClient(run=gone)) == {}
    down = FakeRun({"scontrol": (1, "", "slurm_load_jobs error: Unable to contact slurm controller\n")})
    with pytest.raises(TorchSlurmError, match="Slurm's controller cannot be reached"):
        slurm_tasks(sweep, SlurmClient(run=down))


OUTCOMES = {
    "completed": Outcome("completed", 2, 90, 10.0, 1.0),
    "failed": Outcome("failed", 0, 3, 2.0, 1.0, "ValueError: injected failure at step 3", 1),
    "stopped": Outcome("stopped", 1, 40, 5.0, 1.0, requeued=False),
    "requeued": Outcome("stopped", 1, 40, 5.0, 1.0, requeued=True),
}


@pytest.mark.parametrize(("outcome", "slurm", "submitted", "state", "reason"), [
    (None, None, False, "not started", "never submitted"),
    (None, None, True, "unknown", "submitted as 7_0, but neither Slurm nor its run_dir knows it"),
    (None, ("PENDING", "JobArrayTaskLimit", ""), True, "pending", "JobArrayTaskLimit"),
    ("stopped", ("PENDING", "BeginTime", ""), True, "pending", "BeginTime"),  # requeued: Slurm first
    ("failed", ("RUNNING", "None", ""), True, "running", ""),  # resubmitted after a failure: it runs again
    ("completed", ("COMPLETING", "None", ""), True, "running", ""),
    (None, ("REQUEUED", "None", ""), True, "running", ""),
    ("completed", ("COMPLETED", "None", "0:0"), True, "completed", "2 epoch(s), step 90"),
    ("completed", None, True, "completed", "2 epoch(s), step 90"),
    ("failed", ("FAILED", "NonZeroExitCode", "1:0"), True, "failed", "ValueError: injected failure at step 3"),
    ("stopped", ("COMPLETED", "None", "0:0"), True, "failed",
     "stopped (preempted or time limit) at epoch 1, step 40 with no requeue left"),
    ("requeued", None, True, "failed", "stopped at epoch 1, step 40 and requeued, but Slurm has no queued"),
    (None, ("FAILED", "NonZeroExitCode", "2:0"), True, "failed", "Slurm: FAILED, exit code 2:0 (NonZeroExitCode)"),
    (None, ("TIMEOUT", "TimeLimit", "0:15"), True, "failed", "Slurm: TIMEOUT, exit code 0:15 (TimeLimit)"),
    (None, ("CANCELLED", "None", "0:15"), True, "failed", "Slurm: CANCELLED, exit code 0:15"),
    (None, ("OUT_OF_MEMORY", "OutOfMemory", "0:125"), True, "failed", "Slurm: OUT_OF_MEMORY"),
    (None, ("COMPLETED", "None", "0:0"), True, "completed", "Slurm: COMPLETED (the script wrote no outcome.json)"),
])
def test_the_state_of_a_point(tmp_path: Path, outcome: str | None, slurm: tuple[str, str, str] | None,
                              submitted: bool, state: str, reason: str) -> None:
    sweep = manifest(tmp_path, 1, (Submission("7", (0,), 1.0, "s"),) if submitted else ())
    tasks = {} if slurm is None else {0: TaskView(0, "7_0", *slurm)}
    (found,) = point_states(sweep, {0: OUTCOMES[outcome] if outcome else None}, tasks)
    assert (found.state, found.job) == (state, "7_0" if submitted else None)
    assert found.reason.startswith(reason), found.reason
    assert to_resubmit([found]) == ([] if state in ("completed", "running", "pending") else [0])


def test_resubmission_takes_every_unsettled_point_in_order(tmp_path: Path) -> None:
    sweep = manifest(tmp_path, 6, (Submission("7", (0, 1, 2, 3, 4), 1.0, "s"), Submission("9", (4,), 2.0, "s2")))
    for point, outcome in zip(sweep.points, ("completed", "failed", None, "stopped", "failed", None), strict=True):
        if outcome:
            (sweep.run_dir(point)).mkdir()
            (sweep.run_dir(point) / OUTCOME_FILE).write_text(OUTCOMES[outcome].to_json())
    tasks = {2: TaskView(2, "7_2", "PENDING", "Priority"), 4: TaskView(4, "9_4", "RUNNING")}
    states = point_states(sweep, read_outcomes(sweep), tasks)
    assert [(s.state, s.job) for s in states] == [("completed", "7_0"), ("failed", "7_1"), ("pending", "7_2"),
                                                  ("failed", "7_3"), ("running", "9_4"), ("not started", None)]
    assert to_resubmit(states) == [1, 3, 5]
    assert states[0] == PointState(0, "0-lr=0", {"lr": 0}, "completed", "2 epoch(s), step 90", "7_0")
