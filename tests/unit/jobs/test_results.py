"""A sweep's rows (or a folder's) from synthetic metrics.jsonl, outcome.json and sweep.json files, in
every state a point can be in, while the runs are still writing."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.unit.jobs.conftest import FakeRun, fixture

from torchslurm.errors import ConfigError, SlurmError
from torchslurm.jobs.results import METRICS_FILE, collect, epoch_records, read_metrics, run_dirs, settings_of_name
from torchslurm.jobs.slurm import SlurmClient
from torchslurm.jobs.sweepstate import Manifest, Outcome, Point, Submission, write_manifest


def _epoch(epoch: int, loss: float, accuracy: float, time_s: float = 2.0) -> dict[str, Any]:
    """A record as the Trainer writes it (train/report.py)."""
    return {"kind": "epoch", "epoch": epoch, "step": 10 * epoch, "train_loss": loss + 0.1,
            "train_accuracy": accuracy - 0.05, "val_loss": loss, "val_accuracy": accuracy, "val_samples": 359,
            "samples_per_s": 500.0, "samples_per_s_per_rank": 250.0, "epoch_time_s": time_s, "lr": 0.1}


def _lines(*records: dict[str, Any]) -> list[str]:
    return [json.dumps(r) + "\n" for r in records]


def _write_run(run_dir: Path, lines: Sequence[str], outcome: Outcome | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / METRICS_FILE).write_text("".join(lines))
    if outcome is not None:
        (run_dir / "outcome.json").write_text(outcome.to_json())
    return run_dir


def _outcome(state: str, epochs: int = 2, error: str | None = None, requeued: bool = False) -> Outcome:
    return Outcome(state, epochs, 10 * epochs, 4.0, 1.7e9, error, 0, requeued)


def test_step_records_are_skipped_and_a_half_written_last_line_is_counted_not_raised() -> None:
    step = {"kind": "step", "epoch": 1, "step": 5, "loss": 1.0, "lr": 0.1, "samples_per_s": 9.0}
    lines = [*_lines(step, _epoch(1, 0.5, 0.8), step, _epoch(2, 0.3, 0.9)), '{"kind": "epoch", "epo']
    metrics = epoch_records(lines)
    assert metrics.epochs_done == 2 and metrics.unread == 1
    assert [r["epoch"] for r in metrics.epochs] == [1, 2]


def test_best_is_the_smallest_loss_and_the_largest_accuracy_final_the_last_epoch() -> None:
    metrics = epoch_records(_lines(_epoch(1, 0.5, 0.8, 3.0), _epoch(2, 0.2, 0.95, 2.5), _epoch(3, 0.4, 0.9, 2.5)))
    assert metrics.names() == ["loss", "accuracy"]  # val_samples has no train_samples: it counts, it is no metric
    assert (metrics.best("loss"), metrics.final("loss")) == (0.2, 0.4)
    assert (metrics.best("accuracy"), metrics.final("accuracy")) == (0.95, 0.9)
    assert metrics.train_time_s == 8.0


def test_a_diverged_run_has_nan_final_and_the_best_of_its_finite_epochs() -> None:
    metrics = epoch_records(_lines(_epoch(1, 0.5, 0.8), _epoch(2, math.nan, 0.1)))
    assert metrics.best("loss") == 0.5 and math.isnan(metrics.final("loss") or 0.0)
    only_nan = epoch_records(_lines(_epoch(1, math.nan, 0.1)))
    assert math.isnan(only_nan.best("loss") or 0.0)


def test_an_epoch_done_again_after_a_resume_replaces_the_first_try_and_what_came_after() -> None:
    """The Trainer drops records after the checkpoint it resumes from; a file where that did not happen
    (a copy taken mid-way) still reads as one consistent run."""
    metrics = epoch_records(_lines(_epoch(1, 0.5, 0.8), _epoch(2, 0.4, 0.85), _epoch(3, 0.35, 0.86),
                                   _epoch(2, 0.3, 0.9, 5.0), _epoch(3, 0.25, 0.92)))
    assert [(r["epoch"], r["val_loss"]) for r in metrics.epochs] == [(1, 0.5), (2, 0.3), (3, 0.25)]
    assert metrics.train_time_s == 9.0


def test_lines_that_are_not_records_are_counted_and_a_missing_file_is_no_run_yet(tmp_path: Path) -> None:
    metrics = epoch_records(["[1, 2]\n", "null\n", "\n", json.dumps({"kind": "epoch", "epoch": "one"}) + "\n",
                             json.dumps({"kind": "epoch", "epoch": 1, "val_loss": True}) + "\n"])
    assert metrics.unread == 2 and metrics.epochs_done == 1 and metrics.names() == []
    assert read_metrics(tmp_path / "not-yet").epochs == () and read_metrics(tmp_path / "not-yet").epochs_done == 0


def test_settings_are_read_from_run_folder_names_that_hold_them() -> None:
    assert settings_of_name("3-lr=0.001,seed=2,opt=adam") == {"lr": 0.001, "seed": 2, "opt": "adam"}
    assert settings_of_name("lr=1e-3") == {"lr": 0.001}
    assert settings_of_name("demo") == {} and settings_of_name("lr=0.1,junk") == {} and settings_of_name("3-") == {}


def test_a_folder_of_run_dirs_is_one_row_each_ordered_by_index_then_name(tmp_path: Path) -> None:
    _write_run(tmp_path / "10-lr=0.1", _lines(_epoch(1, 0.5, 0.8)), _outcome("completed", 1))
    _write_run(tmp_path / "2-lr=0.01", _lines(_epoch(1, 0.6, 0.7)), _outcome("failed", 1, "ValueError: boom"))
    _write_run(tmp_path / "extra", [*_lines(_epoch(1, 0.7, 0.6)), json.dumps(_epoch(2, 0.6, 0.7))[:30]])  # writing
    (tmp_path / "no-metrics").mkdir()
    assert [d.name for d in run_dirs(tmp_path)] == ["2-lr=0.01", "10-lr=0.1", "extra"]
    results = collect(tmp_path, SlurmClient(run=FakeRun({})))  # a folder of runs asks Slurm nothing
    assert results.columns() == ["run", "lr", "state", "epochs_done", "best_val_loss", "final_val_loss",
                                 "best_val_accuracy", "final_val_accuracy", "train_time_s", "reason"]
    rows = results.rows()
    assert [(r["run"], r["lr"], r["state"], r["epochs_done"]) for r in rows] == [
        ("2-lr=0.01", 0.01, "failed", 1), ("10-lr=0.1", 0.1, "completed", 1), ("extra", None, "unknown", 1)]
    assert rows[0]["reason"] == "ValueError: boom"
    assert rows[2]["reason"] == "no outcome.json: running, killed, or not a Trainer's run"
    assert any("Slurm was not asked" in note for note in results.notes)


def test_a_run_dir_itself_is_one_row(tmp_path: Path) -> None:
    _write_run(tmp_path / "demo", _lines(_epoch(1, 0.5, 0.8)), _outcome("completed", 1))
    rows = collect(tmp_path / "demo", None).rows()
    assert [(r["run"], r["state"], r["best_val_loss"]) for r in rows] == [("demo", "completed", 0.5)]


def _sweep(root: Path, submissions: Sequence[Submission] = ()) -> Manifest:
    """Four points of lr x seed, written where a sweep writes them."""
    grid = [(0.1, 0), (0.1, 1), (0.01, 0), (0.01, 1)]
    points = tuple(Point(i, f"{i}-lr={lr},seed={seed}", {"lr": lr, "seed": seed}) for i, (lr, seed) in enumerate(grid))
    manifest = Manifest("lr-seed", root, points, tuple(submissions))
    root.mkdir(parents=True, exist_ok=True)
    write_manifest(manifest)
    return manifest


def test_a_sweep_without_slurm_takes_each_state_from_its_outcome(tmp_path: Path) -> None:
    manifest = _sweep(tmp_path / "lr-seed", [Submission("4", (0, 1, 2), 1.7e9, "/x/sweep.sbatch")])
    run = manifest.run_dir
    _write_run(run(manifest.points[0]), _lines(_epoch(1, 0.5, 0.8), _epoch(2, 0.3, 0.9)), _outcome("completed"))
    _write_run(run(manifest.points[1]), _lines(_epoch(1, 0.9, 0.3)), _outcome("failed", 1, "rank 1: NaN loss"))
    _write_run(run(manifest.points[2]), [*_lines(_epoch(1, 0.6, 0.7)), '{"kind": "ep'])  # running, mid-line
    results = collect(manifest.sweep_dir, None)
    assert results.sweep == "lr-seed" and results.keys == ("lr", "seed")
    rows = results.rows()
    assert [(r["point"], r["lr"], r["seed"], r["state"], r["epochs_done"]) for r in rows] == [
        (0, 0.1, 0, "completed", 2), (1, 0.1, 1, "failed", 1), (2, 0.01, 0, "unknown", 1),
        (3, 0.01, 1, "not started", 0)]
    assert rows[1]["reason"] == "rank 1: NaN loss"
    assert rows[2]["reason"] == "no outcome.json yet: running, or killed (Slurm was not asked)"
    assert rows[3]["best_val_loss"] is None and rows[3]["train_time_s"] is None
    assert results.notes[0].startswith("Slurm was not asked (--no-slurm)")
    assert any("1 line(s) not read" in note for note in results.notes)


def test_a_stopped_point_with_no_requeue_left_has_failed(tmp_path: Path) -> None:
    manifest = _sweep(tmp_path / "s", [Submission("4", (0,), 1.7e9, "/x/sweep.sbatch")])
    _write_run(manifest.run_dir(manifest.points[0]), _lines(_epoch(1, 0.5, 0.8)), _outcome("stopped", 1))
    row = collect(manifest.sweep_dir, None).rows()[0]
    assert (row["state"], row["reason"]) == ("failed", "stopped (preempted or time limit) at epoch 1, step 10 "
                                                       "with no requeue left")


def test_slurm_says_which_points_are_pending_and_running(tmp_path: Path) -> None:
    """Array 11 as scontrol showed it on the sandbox: tasks 0 and 1 running, 2-3 pending (throttled by %2)."""
    manifest = _sweep(tmp_path / "s", [Submission("11", (0, 1, 2, 3), 1.7e9, "/x/sweep.sbatch")])
    _write_run(manifest.run_dir(manifest.points[0]), _lines(_epoch(1, 0.5, 0.8)))  # point 1 has no run_dir yet
    client = SlurmClient(run=FakeRun({"scontrol": (0, fixture("scontrol_array_running.txt"), "")}))
    results = collect(manifest.sweep_dir, client)
    assert [(r["state"], r["epochs_done"]) for r in results.rows()] == [
        ("running", 1), ("running", 0), ("pending", 0), ("pending", 0)]
    assert results.rows()[2]["reason"] == "JobArrayTaskLimit"
    assert results.notes == ()


def test_slurm_s_end_state_is_the_reason_of_a_task_that_wrote_no_outcome(tmp_path: Path) -> None:
    manifest = _sweep(tmp_path / "s", [Submission("4", (0, 1, 2, 3), 1.7e9, "/x/sweep.sbatch")])
    for point in manifest.points[:3]:
        _write_run(manifest.run_dir(point), _lines(_epoch(1, 0.5, 0.8)), _outcome("completed", 1))
    client = SlurmClient(run=FakeRun({"scontrol": (0, fixture("scontrol_array_finished.txt"), "")}))
    rows = collect(manifest.sweep_dir, client).rows()
    assert [r["state"] for r in rows] == ["completed", "completed", "completed", "failed"]
    assert rows[3]["reason"] == "Slurm: FAILED, exit code 3:0 (NonZeroExitCode)"


def test_where_slurm_cannot_be_asked_the_table_says_so_and_still_has_its_rows(tmp_path: Path) -> None:
    manifest = _sweep(tmp_path / "s", [Submission("4", (0, 1, 2, 3), 1.7e9, "/x/sweep.sbatch")])
    _write_run(manifest.run_dir(manifest.points[0]), _lines(_epoch(1, 0.5, 0.8)), _outcome("completed", 1))

    def no_slurm(argv: Sequence[str], **kw: Any) -> Any:
        raise SlurmError(f"{argv[0]} not found on PATH.", "run this on a Slurm login node.")

    results = collect(manifest.sweep_dir, SlurmClient(run=no_slurm))
    assert [r["state"] for r in results.rows()] == ["completed", "unknown", "unknown", "unknown"]
    assert results.notes[0].startswith("Slurm could not be asked (scontrol not found on PATH): states come from")


def test_a_copied_sweep_is_read_where_it_is_now_not_where_its_manifest_was_written(tmp_path: Path) -> None:
    manifest = _sweep(tmp_path / "cluster" / "s")
    _write_run(manifest.run_dir(manifest.points[3]), _lines(_epoch(1, 0.5, 0.8)), _outcome("completed", 1))
    copy = tmp_path / "laptop" / "s"
    copy.parent.mkdir()
    manifest.sweep_dir.rename(copy)
    rows = collect(copy, None).rows()
    assert [r["state"] for r in rows] == ["not started"] * 3 + ["completed"]
    assert rows[3]["run_dir"] == str(copy / "3-lr=0.01,seed=1")


def test_bad_directories_are_told_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope is not a folder \(it does not exist\)\. HINT: give a sweep's"):
        collect(tmp_path / "nope", None)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"file is not a folder\. HINT"):
        collect(tmp_path / "file", None)
    with pytest.raises(ConfigError, match=r"holds no run: no sweep.json, no metrics.jsonl in it or in a folder"):
        collect(tmp_path, None)
    _sweep(tmp_path / "lr-seed")
    with pytest.raises(ConfigError) as err:
        collect(tmp_path, None)
    assert err.value.hint == f"it holds sweeps: `torchslurm results {tmp_path / 'lr-seed'}`."
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "sweep.json").write_text("{")
    with pytest.raises(ConfigError, match=r"sweep.json is not JSON"):
        collect(tmp_path / "bad", None)


def test_a_swept_key_named_as_a_results_column_gets_a_column_of_its_own(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    write_manifest(Manifest("e", root, (Point(0, "0-epochs=3,state=on", {"epochs": 3, "state": "on"}),)))
    results = collect(root, None)
    assert results.columns()[:5] == ["point", "epochs", "swept_state", "state", "epochs_done"]
    assert [(r["epochs"], r["swept_state"], r["state"]) for r in results.rows()] == [(3, "on", "not started")]
