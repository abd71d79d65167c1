"""jobs.results, read whole: the notes and refusals a results table carries, the row of a run, the
columns swept keys get, and files that are not what they should be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.unit.jobs.conftest import FakeRun

from torchslurm.errors import ConfigError
from torchslurm.jobs.results import METRICS_FILE, collect, epoch_records, key_column, read_metrics, run_dirs
from torchslurm.jobs.slurm import SlurmClient
from torchslurm.jobs.sweepstate import Manifest, Outcome, Point, Submission, write_manifest

NOT_ASKED = ("states come from each point's outcome.json; a point still queued or running shows as unknown")


def epoch(n: int, **values: float) -> str:
    return json.dumps({"kind": "epoch", "epoch": n, **values}) + "\n"


def run(run_dir: Path, *lines: str, outcome: Outcome | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / METRICS_FILE).write_text("".join(lines))
    if outcome is not None:
        (run_dir / "outcome.json").write_text(outcome.to_json())
    return run_dir


def sweep(root: Path, overrides: dict[str, Any], submitted: bool = True) -> Manifest:
    root.mkdir(parents=True, exist_ok=True)
    manifest = Manifest("s", root, (Point(0, "0-x", overrides),),
                        (Submission("4", (0,), 1.7e9, "/x/s.sbatch"),) if submitted else ())
    write_manifest(manifest)
    return manifest


def test_a_row_of_a_run_whole(tmp_path: Path) -> None:
    """accuracy before loss in the file, loss first in the columns; best and final apart; the time summed."""
    records = [epoch(1, val_accuracy=0.8, train_accuracy=0.7, val_loss=0.5, train_loss=0.6, epoch_time_s=2.0),
               epoch(2, val_accuracy=0.9, train_accuracy=0.8, val_loss=0.6, train_loss=0.5, epoch_time_s=3.5)]
    run(tmp_path / "7", *records, outcome=Outcome("completed", 2, 20, 5.5, 1.7e9))
    results = collect(tmp_path, None)
    assert results.directory == tmp_path and results.keys == ()
    assert results.columns() == ["run", "state", "epochs_done", "best_val_loss", "final_val_loss",
                                 "best_val_accuracy", "final_val_accuracy", "train_time_s", "reason"]
    assert results.rows() == [{"run": "7", "state": "completed", "epochs_done": 2, "best_val_loss": 0.5,
                               "final_val_loss": 0.6, "best_val_accuracy": 0.9, "final_val_accuracy": 0.9,
                               "train_time_s": 5.5, "reason": "2 epoch(s), step 20", "run_dir": str(tmp_path / "7")}]
    assert results.notes == ("states from each run's outcome.json (not a sweep: Slurm was not asked)",)


@pytest.mark.parametrize(("outcome", "state", "reason"), [
    (None, "unknown", "no outcome.json: running, killed, or not a Trainer's run"),
    (Outcome("failed", 1, 5, 1.0, 1.7e9, None, 3), "failed", "rank 3 failed"),
    (Outcome("stopped", 1, 5, 1.0, 1.7e9, requeued=True), "failed",
     "stopped at epoch 1, step 5 and requeued, but Slurm has no queued or running task of it"),
])
def test_a_run_outside_a_sweep_is_in_the_state_its_outcome_says(tmp_path: Path, outcome: Outcome | None, state: str,
                                                               reason: str) -> None:
    run(tmp_path / "r", epoch(1), outcome=outcome)
    (row,) = collect(tmp_path, None).rows()
    assert (row["state"], row["reason"]) == (state, reason)


def test_loss_is_the_first_metric_wherever_it_comes(tmp_path: Path) -> None:
    metrics = epoch_records([epoch(1, val_f1=0.5, train_f1=0.4, val_loss=0.5, train_loss=0.6)])
    assert metrics.names() == ["loss", "f1"]
    run(tmp_path / "0-a", epoch(1, val_f1=0.5, train_f1=0.4))
    run(tmp_path / "1-b", epoch(1, val_loss=0.5, train_loss=0.6))
    assert collect(tmp_path, None).metric_names() == ["loss", "f1"]


def test_a_run_dir_named_as_settings_holds_no_columns_when_it_is_the_folder_given(tmp_path: Path) -> None:
    folder = run(tmp_path / "lr=0.1", epoch(1))
    assert collect(folder, None).keys == ()
    assert collect(tmp_path, None).keys == ("lr",)


@pytest.mark.parametrize(("key", "column"), [
    ("best_val_x", "swept_best_val_x"), ("final_val_x", "swept_final_val_x"), ("swept_x", "swept_swept_x"),
    ("state", "swept_state"), ("lr", "lr"), ("best", "best")])
def test_a_swept_key_that_could_be_read_as_a_column_of_results_gets_a_prefix(key: str, column: str) -> None:
    assert key_column(key) == column


def test_lines_read_and_not_read(tmp_path: Path) -> None:
    metrics = epoch_records(["[1]\n", "3\n", epoch(1), '{"kind": "epoch"\n', epoch(2)])
    assert (metrics.unread, [r["epoch"] for r in metrics.epochs]) == (3, [1.0, 2.0])
    (tmp_path / "bytes").mkdir()
    (tmp_path / "bytes" / METRICS_FILE).write_bytes(epoch(1).encode() + b'{"kind": "epoch", "n": "\xff", "epoch": 2}\n')
    assert [r["epoch"] for r in read_metrics(tmp_path / "bytes").epochs] == [1.0, 2.0]  # a byte not UTF-8: replaced
    run(tmp_path / "r", epoch(1), '{"kind": "ep')
    assert collect(tmp_path, None).notes[1:] == (
        f"{tmp_path / 'r' / METRICS_FILE}: 1 line(s) not read (a line being written, or not JSON)",)


def test_files_that_cannot_be_read_are_refused_whole(tmp_path: Path) -> None:
    (tmp_path / METRICS_FILE).mkdir()
    with pytest.raises(ConfigError) as metrics:
        read_metrics(tmp_path)
    assert (metrics.value.message, metrics.value.hint) == (
        f"{tmp_path / METRICS_FILE} cannot be read: Is a directory.",
        "check the file's permissions (results reads every run's metrics).")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError) as listing:
        run_dirs(tmp_path / "file")
    assert (listing.value.message, listing.value.hint) == (
        f"{tmp_path / 'file'} cannot be listed: Not a directory.", "check the folder's permissions.")
    with pytest.raises(ConfigError) as missing:
        collect(tmp_path / "nowhere", None)
    assert (missing.value.message, missing.value.hint) == (
        f"{tmp_path / 'nowhere'} is not a folder (it does not exist).",
        "give a sweep's folder (<run_dir>/<sweep name>, the one with sweep.json), or a folder of run_dirs.")


@pytest.mark.parametrize(("sweeps", "hint"), [
    ([], "give a sweep's folder (the one with sweep.json), a run_dir (the one with metrics.jsonl), or a folder of "
         "run_dirs."),
    (["a"], "it holds sweeps: `torchslurm results {}/a`."),
    (["b", "a"], "it holds sweeps: `torchslurm results {}/a` (and b)."),
    (["a", "b", "c", "d"], "it holds sweeps: `torchslurm results {}/a` (and b, c, d)."),
    (["a", "b", "c", "d", "e"], "it holds sweeps: `torchslurm results {}/a` (and b, c, d, ...)."),
])
def test_a_folder_of_no_runs_names_the_sweeps_in_it(tmp_path: Path, sweeps: list[str], hint: str) -> None:
    for name in sweeps:
        sweep(tmp_path / name, {})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as refused:
        collect(tmp_path, None)
    assert (refused.value.message, refused.value.hint) == (
        f"{tmp_path} holds no run: no sweep.json, no metrics.jsonl in it or in a folder right under it.",
        hint.format(tmp_path))


def test_an_override_that_is_no_single_value_is_its_json(tmp_path: Path) -> None:
    manifest = sweep(tmp_path, {"layers": [1, 2], "opt": {"name": "adam"}, "seed": None}, submitted=False)
    (row,) = collect(manifest.sweep_dir, None).rows()
    assert (row["layers"], row["opt"], row["seed"]) == ("[1, 2]", '{"name": "adam"}', None)


def test_what_the_notes_say_when_slurm_was_not_asked_could_not_be_or_forgot(tmp_path: Path) -> None:
    manifest = sweep(tmp_path, {"lr": 0.1})
    unasked = collect(manifest.sweep_dir, None)
    assert unasked.notes == (f"Slurm was not asked (--no-slurm): {NOT_ASKED}",)
    assert unasked.rows()[0]["reason"] == "no outcome.json yet: running, or killed (Slurm was not asked)"
    down = SlurmClient(run=FakeRun({"scontrol": (1, "", "slurm_load_jobs error: Unable to contact slurm controller")}))
    failed = collect(manifest.sweep_dir, down)
    assert failed.notes == ("Slurm could not be asked (scontrol show job 4 failed (1): slurm_load_jobs error: Unable "
                            f"to contact slurm controller): {NOT_ASKED}",)  # its message's full stop dropped
    forgot = SlurmClient(run=FakeRun({"scontrol": (1, "", "slurm_load_jobs error: Invalid job id specified")}))
    answered = collect(manifest.sweep_dir, forgot)
    assert answered.notes == ()
    assert answered.rows()[0]["reason"] == ("submitted as 4_0, but neither Slurm nor its run_dir knows it (Slurm "
                                            "forgets finished jobs after MinJobAge)")
    assert answered.directory == tmp_path
