"""metrics.py: exact per-batch sums, their totals, and the metrics.jsonl log a resumed run truncates."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from torchslurm.train.metrics import (
    CurvePlotter,
    MetricsLog,
    Totals,
    all_reduce_sums,
    batch_sums,
    plot_curves,
    totals,
)


def test_batch_sums_weigh_the_mean_loss_by_the_batch_and_count_argmax_hits() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0]])
    target = torch.tensor([0, 0, 0])  # rows 0 and 2 are right
    sums = batch_sums(logits, target, torch.tensor(0.5))
    assert sums.dtype == torch.float64 and sums.tolist() == [1.5, 2.0, 3.0]


def test_batch_sums_count_no_hits_when_the_output_is_not_class_logits() -> None:
    regression = batch_sums(torch.zeros(4, 1, 3), torch.zeros(4, 3), torch.tensor(2.0))
    assert regression.tolist() == [8.0, 0.0, 4.0]


def test_totals_over_uneven_batches_are_the_dataset_mean() -> None:
    """Two batches of 3 and 1 samples: the mean over 4 samples, not the mean of the two batch means."""
    first = batch_sums(torch.tensor([[1.0, 0.0]] * 3), torch.tensor([0, 0, 1]), torch.tensor(1.0))
    second = batch_sums(torch.tensor([[0.0, 1.0]]), torch.tensor([1]), torch.tensor(5.0))
    result = totals(all_reduce_sums(first + second))  # no process group: the sums as they are
    assert result == Totals(loss_sum=8.0, correct=3, count=4)
    assert (result.avg_loss, result.accuracy) == (2.0, 0.75)


def test_empty_totals_are_nan_not_a_division_error() -> None:
    empty = Totals(0.0, 0, 0)
    assert math.isnan(empty.avg_loss) and math.isnan(empty.accuracy)


def test_the_log_appends_one_json_line_per_record(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "run" / "metrics.jsonl")
    assert log.records() == []  # no file yet
    log.append({"kind": "step", "step": 1, "loss": 0.5})
    log.append({"kind": "epoch", "step": 2, "epoch": 1})
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert log.records()[1] == {"kind": "epoch", "step": 2, "epoch": 1}


def test_a_resume_drops_the_records_after_its_checkpoint_step(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (10, 20, 30, 40):
        log.append({"kind": "step", "step": step})
    log.keep_until(20)  # resumed from step 20: steps 30 and 40 are trained again and logged again
    assert [r["step"] for r in log.records()] == [10, 20]
    log.keep_until(0)  # a fresh start empties the log
    assert log.records() == [] and (tmp_path / "metrics.jsonl").exists()
    assert not (tmp_path / "metrics.jsonl.tmp").exists()  # replaced atomically, nothing left over


def _epoch(n: int) -> dict[str, Any]:
    return {"kind": "epoch", "epoch": n, "train_loss": 1.0 / n, "val_loss": 1.2 / n, "train_accuracy": 0.5,
            "val_accuracy": 0.4, "samples_per_s": 100.0, "samples_per_s_per_rank": 50.0}


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_curves_are_not_drawn_at_an_epoch_end_of_a_short_run_only_once_at_the_end(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = []
    drawn: list[list[int]] = []
    clock = _Clock()
    plotter = CurvePlotter(tmp_path / "curves.png", lambda: records, min_interval_s=60, clock=clock,
                           draw=lambda recs, _: drawn.append([r["epoch"] for r in recs]))
    for n in (1, 2, 3):
        records.append(_epoch(n))
        clock.now += 5
        plotter.update()
    assert drawn == []  # no epoch end of this 15 s run paid for a plot
    plotter.close()
    plotter.wait()
    assert drawn == [[1, 2, 3]]
    plotter.close()
    plotter.wait()
    assert drawn == [[1, 2, 3]]  # nothing new: not drawn again


def test_a_long_run_redraws_in_the_background_at_most_once_per_interval(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = []
    release, started = threading.Event(), threading.Event()
    drawn: list[list[int]] = []

    def slow_draw(recs: list[Mapping[str, Any]], _: Path) -> None:
        started.set()
        release.wait(10)
        drawn.append([r["epoch"] for r in recs])

    clock = _Clock()
    plotter = CurvePlotter(tmp_path / "curves.png", lambda: records, min_interval_s=60, clock=clock, draw=slow_draw)
    records.append(_epoch(1))
    clock.now = 61
    plotter.update()  # due: starts a background draw and returns at once
    assert started.wait(10) and drawn == []
    records.append(_epoch(2))
    clock.now = 200
    plotter.update()  # due, but a draw is in flight: not a second thread, just remembered
    plotter.close()  # returns at once: the final draw waits for the one in flight, in its own thread
    assert drawn == []
    release.set()
    plotter.wait()
    assert drawn == [[1], [1, 2]]


def test_a_failing_draw_is_a_warning_not_a_failed_run(tmp_path: Path, caplog: Any) -> None:
    def broken(recs: list[Mapping[str, Any]], path: Path) -> None:
        raise OSError("No space left on device")

    plotter = CurvePlotter(tmp_path / "curves.png", lambda: [_epoch(1)], draw=broken)
    plotter.update()
    plotter.close()
    plotter.wait()
    assert "could not draw" in caplog.text and "No space left on device" in caplog.text


def test_plot_curves_writes_a_png_named_after_the_run(tmp_path: Path) -> None:
    run = tmp_path / "my-run"
    run.mkdir()
    plot_curves([_epoch(1), _epoch(2)], run / "curves.png")
    png = (run / "curves.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert not (run / "curves.tmp.png").exists()


def test_the_log_never_writes_through_a_link_planted_as_metrics_jsonl(tmp_path: Path) -> None:
    from torchslurm.errors import TorchSlurmError

    (tmp_path / "precious").write_text("keep me")
    (tmp_path / "metrics.jsonl").symlink_to(tmp_path / "precious")
    log = MetricsLog(tmp_path / "metrics.jsonl")
    with pytest.raises(TorchSlurmError, match=r"metrics.jsonl is a symbolic link"):
        log.append({"kind": "epoch", "step": 1})
    log.keep_until(0)  # rewritten whole: the link is replaced, its target untouched
    assert (tmp_path / "precious").read_text() == "keep me" and not (tmp_path / "metrics.jsonl").is_symlink()
