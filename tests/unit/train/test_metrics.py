"""metrics.py: exact per-batch sums, their totals, and the metrics.jsonl log a resumed run truncates."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from torchslurm.train.metrics import MetricsLog, Totals, all_reduce_sums, batch_sums, totals


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
