"""The results plot: which key goes along x, which curves are drawn, a real PNG (matplotlib's Agg)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchslurm.errors import ConfigError
from torchslurm.jobs.results import METRICS_FILE, Results, collect
from torchslurm.jobs.resultsplot import check, curve_metric, plot
from torchslurm.jobs.sweepstate import Manifest, Point, write_manifest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _sweep(root: Path, grid: list[dict[str, object]], done: int) -> Results:
    """A sweep of `grid`'s points; the first `done` have two epochs of metrics."""
    points = tuple(Point(i, f"{i}-p", overrides) for i, overrides in enumerate(grid))
    root.mkdir(parents=True)
    write_manifest(Manifest("demo", root, points))
    for i in range(done):
        (root / f"{i}-p").mkdir()
        records = [{"kind": "epoch", "epoch": e, "train_loss": 1.0 / (e + i), "val_loss": 1.0 / (e + i + 1),
                    "train_accuracy": 0.5, "val_accuracy": 0.5 + 0.1 * e, "epoch_time_s": 1.0} for e in (1, 2)]
        (root / f"{i}-p" / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    return collect(root, None)


GRID: list[dict[str, object]] = [{"lr": lr, "bs": bs, "opt": "sgd"} for bs in (32, 64) for lr in (0.001, 0.01, 0.1)]


def test_x_is_the_first_key_that_varies_unless_named(tmp_path: Path) -> None:
    results = _sweep(tmp_path / "s", [{"opt": "sgd", "lr": 0.1}, {"opt": "sgd", "lr": 0.2}], done=2)
    assert check(results, "best_val_loss", None) == "lr"
    assert check(results, "best_val_loss", "opt") == "opt"


def test_the_curves_follow_the_metric_drawn(tmp_path: Path) -> None:
    results = _sweep(tmp_path / "s", GRID, done=1)
    assert curve_metric(results, "best_val_accuracy") == "accuracy"
    assert curve_metric(results, "final_val_loss") == "loss"
    assert curve_metric(results, "train_time_s") == "loss"


def test_bad_metric_and_key_are_told_with_the_choices(tmp_path: Path) -> None:
    results = _sweep(tmp_path / "s", GRID, done=2)
    with pytest.raises(ConfigError) as err:
        check(results, "val_loss", None)
    assert err.value.message == "--plot 'val_loss' is not a column of these results."
    assert err.value.hint is not None and err.value.hint.startswith("did you mean --plot best_val_loss? the columns "
                                                                    "are: lr, bs, epochs_done, best_val_loss,")
    with pytest.raises(ConfigError, match=r"--plot 'state' has no number to draw in any row\. HINT: draw one of: lr,"):
        check(results, "state", None)
    with pytest.raises(ConfigError, match=r"--x 'seed' is not a swept key of .*HINT: use one of: lr, bs, opt\."):
        check(results, "best_val_loss", "seed")


def test_a_plot_is_a_png_even_while_points_have_no_metrics_yet(tmp_path: Path) -> None:
    results = _sweep(tmp_path / "s", GRID, done=4)  # points 4 and 5 have not started
    path = plot(results, "best_val_accuracy", None, tmp_path / "out" / "plot.png")
    assert path == tmp_path / "out" / "plot.png" and path.read_bytes().startswith(PNG_MAGIC)


def test_a_folder_of_runs_without_keys_is_drawn_by_run_name(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / METRICS_FILE).write_text(json.dumps(
            {"kind": "epoch", "epoch": 1, "train_loss": 1.0, "val_loss": 0.5}) + "\n")
    results = collect(tmp_path, None)
    assert check(results, "final_val_loss", None) == "run"
    assert plot(results, "final_val_loss", None, tmp_path / "p.png").read_bytes().startswith(PNG_MAGIC)
