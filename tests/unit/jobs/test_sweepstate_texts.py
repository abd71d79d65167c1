"""jobs.sweepstate, read whole: the manifest and outcome files as written, every refusal of a manifest
with its hint, Slurm's records of an array's tasks field by field, and the reason of every state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchslurm.errors import ConfigError
from torchslurm.jobs.sweepstate import (
    MANIFEST_FILE,
    Manifest,
    Outcome,
    Point,
    PointState,
    Submission,
    TaskView,
    manifest_from_json,
    outcome_from_json,
    point_state,
    read_manifest,
    read_outcome,
    task_indices,
    tasks_from_scontrol,
)

POINT = Point(0, "0-lr=0.1", {"lr": 0.1})


def test_the_manifest_file_whole_in_ascii(tmp_path: Path) -> None:
    sweep = Manifest("λr", tmp_path, (POINT,), (Submission("7", (0,), 1.5, "s.sbatch"),))
    assert sweep.submitted(Submission("8", (0,), 2.0, "t.sbatch")).submissions == (
        Submission("7", (0,), 1.5, "s.sbatch"), Submission("8", (0,), 2.0, "t.sbatch"))
    assert sweep.to_json() == (
        '{\n "version": 1,\n "name": "\\u03bbr",\n "sweep_dir": "' + str(tmp_path) + '",\n "points": [\n  {\n'
        '   "index": 0,\n   "dir": "0-lr=0.1",\n   "overrides": {\n    "lr": 0.1\n   }\n  }\n ],\n "submissions": [\n'
        '  {\n   "job_id": "7",\n   "indices": [\n    0\n   ],\n   "time": 1.5,\n   "script": "s.sbatch"\n  }\n ]\n}\n')


def test_an_outcome_file_whole_and_read_back(tmp_path: Path) -> None:
    outcome = Outcome("stopped", 3, 30, 4.5, 1.7e9, "é", 1, True)
    assert outcome.to_json() == ('{"state": "stopped", "epochs_done": 3, "step": 30, "wall_s": 4.5, "time": '
                                 '1700000000.0, "error": "\\u00e9", "rank": 1, "requeued": true}\n')
    assert outcome_from_json(json.loads(outcome.to_json())) == outcome
    (tmp_path / "outcome.json").write_bytes(b'{"state": "completed", "epochs_done": 1, "step": 2, "wall_s": 1, '
                                            b'"time": 2, "error": "\xff"}')
    assert read_outcome(tmp_path) is None  # not UTF-8: not an outcome, never raised


HINT_REWRITE = ("it is written by `torchslurm sweep`; move it away (or pick another --sweep-name) to start the sweep "
                "afresh.")


def test_every_refusal_of_a_manifest_whole(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as bad:
        manifest_from_json({"version": 2}, "here/sweep.json")
    assert (bad.value.message, bad.value.hint) == (
        "here/sweep.json is not a torchslurm sweep manifest (ValueError: version 2, expected 1).", HINT_REWRITE)
    points = [{"index": i, "dir": str(i), "overrides": {}} for i in (*range(1, 12), 0)]
    with pytest.raises(ConfigError) as order:
        manifest_from_json({"version": 1, "name": "x", "sweep_dir": "/x", "points": points, "submissions": []})
    assert (order.value.message, order.value.hint) == (
        "sweep.json lists points [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], expected 0, 1, 2, ... in order.",
        "it is written by `torchslurm sweep`; do not edit it by hand.")
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"version": 1}))
    with pytest.raises(ConfigError) as named:
        read_manifest(tmp_path)
    assert named.value.message == (f"{tmp_path / MANIFEST_FILE} is not a torchslurm sweep manifest (KeyError: "
                                   "'points').")
    (tmp_path / MANIFEST_FILE).write_bytes(b'{"name": "\xff"}')
    with pytest.raises(ConfigError) as undecodable:
        read_manifest(tmp_path)
    assert undecodable.value.message.startswith(f"{tmp_path / MANIFEST_FILE} is not JSON (")
    assert undecodable.value.hint == ("it is written by `torchslurm sweep` in one piece; move it away to start the "
                                      "sweep afresh.")
    (tmp_path / MANIFEST_FILE).unlink()
    (tmp_path / MANIFEST_FILE).mkdir()
    with pytest.raises(ConfigError) as unreadable:
        read_manifest(tmp_path)
    assert (unreadable.value.message, unreadable.value.hint) == (
        f"cannot read {tmp_path / MANIFEST_FILE}: Is a directory.",
        "check the folder's permissions.")


@pytest.mark.parametrize(("text", "indices"), [
    ("3", [3]), ("2-4%2", [2, 3, 4]), ("1,4-8:2%3", [1, 4, 6, 8]), ("1-3:0", [1, 2, 3]), ("5%", [5]), ("", []),
])
def test_task_indices_of_a_pending_range(text: str, indices: list[int]) -> None:
    assert task_indices(text) == indices


def test_slurm_records_field_by_field_and_records_of_no_array_left_out() -> None:
    records = [{"JobId": "9"}, {"ArrayJobId": "N/A"},
               {"ArrayJobId": "12", "ArrayTaskId": "0", "JobState": "RUNNING", "Reason": "None", "ExitCode": "0:0",
                "Restarts": "2"},
               {"ArrayJobId": "12", "ArrayTaskId": "1"},
               {"ArrayJobId": "12", "ArrayTaskId": "2", "Restarts": "x"},
               {"ArrayJobId": "12"}]
    assert tasks_from_scontrol(records) == {
        0: TaskView(0, "12_0", "RUNNING", "None", "0:0", 2),
        1: TaskView(1, "12_1", "", "", "", 0),
        2: TaskView(2, "12_2", "", "", "", 0)}


def task(state: str, reason: str = "", exit_code: str = "", restarts: int = 0) -> TaskView:
    return TaskView(0, "12_0", state, reason, exit_code, restarts)


@pytest.mark.parametrize(("view", "state", "reason"), [
    (task("PENDING", "None"), "pending", ""),
    (task("PENDING", ""), "pending", ""),
    (task("PENDING", "Priority"), "pending", "Priority"),
    (task("RUNNING"), "running", ""),
    (task("RUNNING", restarts=2), "running", "restart 2"),
    (task("COMPLETED"), "completed", "Slurm: COMPLETED (the script wrote no outcome.json)"),
    (task("COMPLETED", exit_code="0:0"), "completed", "Slurm: COMPLETED (the script wrote no outcome.json)"),
    (task("COMPLETED", exit_code="1:0"), "failed", "Slurm: COMPLETED, exit code 1:0"),
    (task("FAILED", "None"), "failed", "Slurm: FAILED"),
    (task("TIMEOUT", "TimeLimit", "0:15"), "failed", "Slurm: TIMEOUT, exit code 0:15 (TimeLimit)"),
    (None, "unknown", "submitted as 12_0, but neither Slurm nor its run_dir knows it (Slurm forgets finished jobs "
     "after MinJobAge)"),
])
def test_the_reason_of_every_state_whole(view: TaskView | None, state: str, reason: str) -> None:
    assert point_state(POINT, None, view, "12_0") == PointState(0, "0-lr=0.1", {"lr": 0.1}, state, reason, "12_0")
