"""`torchslurm results`: what it prints in each format, where notes and the plot go, its errors."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from torchslurm.cli import main
from torchslurm.jobs.sweepstate import Manifest, Outcome, Point, Submission, write_manifest


def _sweep(root: Path) -> Path:
    """Three points of lr: two completed (point 1 the better), point 2 never run."""
    points = tuple(Point(i, f"{i}-lr={lr}", {"lr": lr}) for i, lr in enumerate((0.1, 0.01, 0.001)))
    root.mkdir()
    write_manifest(Manifest("lrs", root, points, (Submission("4", (0, 1), 1.7e9, "/x/s.sbatch"),)))
    for i, loss in ((0, 0.5), (1, 0.25)):
        (root / points[i].dir).mkdir()
        record = {"kind": "epoch", "epoch": 1, "train_loss": 1.0, "val_loss": loss, "epoch_time_s": 3.0}
        (root / points[i].dir / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        (root / points[i].dir / "outcome.json").write_text(Outcome("completed", 1, 10, 3.5, 1.7e9).to_json())
    return root


def test_the_table_sorted_with_its_notes_below(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["results", str(_sweep(tmp_path / "s")), "--no-slurm", "--sort", "best_val_loss"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "point     lr  state        epochs_done  best_val_loss  final_val_loss  train_time_s  reason",
        "    1   0.01  completed              1           0.25            0.25             3  1 epoch(s), step 10",
        "    0    0.1  completed              1            0.5             0.5             3  1 epoch(s), step 10",
        "    2  0.001  not started            0              -               -             -  never submitted",
        "note: Slurm was not asked (--no-slurm): states come from each point's outcome.json; a point still queued "
        "or running shows as unknown"]


def test_machine_formats_keep_stdout_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = str(_sweep(tmp_path / "s"))
    assert main(["results", sweep, "--no-slurm", "--format", "json", "--sort", "lr", "--desc"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert [(r["lr"], r["state"], r["run_dir"]) for r in rows] == [
        (0.1, "completed", f"{sweep}/0-lr=0.1"), (0.01, "completed", f"{sweep}/1-lr=0.01"),
        (0.001, "not started", f"{sweep}/2-lr=0.001")]
    assert captured.err.startswith("note: Slurm was not asked")
    assert main(["results", sweep, "--no-slurm", "--format", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["best_val_loss"] for r in table] == ["0.5", "0.25", ""]
    assert main(["results", sweep, "--no-slurm", "--format", "md"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == [
        "| point | lr | state | epochs_done | best_val_loss | final_val_loss | train_time_s | reason |",
        "|---:|---:|---|---:|---:|---:|---:|---|"]


def test_the_plot_goes_into_the_sweep_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = _sweep(tmp_path / "s")
    assert main(["results", str(sweep), "--no-slurm", "--plot", "best_val_loss"]) == 0
    assert capsys.readouterr().out.endswith(f"plot: {sweep / 'results-best_val_loss.png'}\n")
    assert (sweep / "results-best_val_loss.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("extra", "error"), [
    (["--sort", "final_loss"], "error: --sort 'final_loss' is not a column of these results. HINT: did you mean "
                          "--sort final_val_loss?"),
    (["--plot", "val_loss"], "error: --plot 'val_loss' is not a column of these results. HINT: did you mean "
                             "--plot best_val_loss?"),
    (["--plot", "best_val_loss", "--x", "seed"], "error: --x 'seed' is not a swept key of"),
])
def test_bad_options_are_errors_before_any_table(extra: list[str], error: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["results", str(_sweep(tmp_path / "s")), "--no-slurm", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(error) and captured.out == ""


def test_a_folder_with_no_runs_is_an_error_with_a_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["results", str(tmp_path)]) == 2
    assert "holds no run" in capsys.readouterr().err
