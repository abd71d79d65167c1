"""What a run says on rank 0: its opening lines, step lines and records, epoch lines and records."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from torchslurm.train.config import TrainConfig
from torchslurm.train.metrics import CurvePlotter, MetricsLog, Totals
from torchslurm.train.report import RunReport
from torchslurm.train.tasks import classification
from torchslurm.train.topology import Topology


def _topo(rank: int = 0) -> Topology:
    return Topology(rank=rank, world_size=4, local_rank=0, device=torch.device("cpu"), backend="gloo", num_nodes=1,
                    local_world_size=4, master="localhost:29500")


def _report(tmp_path: Path, rank: int = 0, **settings: object) -> RunReport:
    config = TrainConfig(**{"batch_size": 8, "lr": 0.05, "run_dir": Path("runs/x"), **settings})  # type: ignore[arg-type]
    log = MetricsLog(tmp_path / "metrics.jsonl")
    drawn: list[int] = []
    curves = CurvePlotter(tmp_path / "curves.png", log.records, min_interval_s=0.0,
                          draw=lambda records, path: drawn.append(len(records)))
    return RunReport(_topo(rank), config, classification(), log, curves)


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    logger = logging.getLogger("torchslurm.train.trainer")  # its own handler: the CLI's set-up stops propagation
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level("INFO", logger="torchslurm.train.trainer"):
            yield caplog
    finally:
        logger.removeHandler(caplog.handler)


@pytest.mark.parametrize("epochs, scaling, expected", [
    (1, "none", "run_dir runs/x: 1 epoch, batch_size 8 per rank, lr 0.05, amp off"),
    (3, "none", "run_dir runs/x: 3 epochs, batch_size 8 per rank, lr 0.05, amp off"),
    (2, "linear", "run_dir runs/x: 2 epochs, batch_size 8 per rank, lr 0.05 (linear scaling → 0.2), amp off"),
])
def test_the_opening_lines(epochs: int, scaling: str, expected: str, tmp_path: Path,
                           lines: pytest.LogCaptureFixture) -> None:
    _report(tmp_path, epochs=epochs, lr_scaling=scaling).start({"none": 1.0, "linear": 4.0}[scaling])
    assert ("Starting distributed training on 4 processes (1 node × 4, gloo, cpu), master localhost:29500"
            in lines.messages)
    assert lines.messages[-1] == expected


def test_step_and_epoch_records_on_rank_0_only(tmp_path: Path, lines: pytest.LogCaptureFixture) -> None:
    report = _report(tmp_path)
    window = torch.tensor([6.0, 3.0, 4.0], dtype=torch.float64)  # loss·n, correct, n
    report.steps(window, 0.0, epoch=0, batch=2, total=5, step=2, lr=0.05)
    report.epoch(1, 5, Totals(10.0, 15, 20), Totals(2.0, 3, 4), seen=80.0, elapsed_s=2.0, lr=0.05)
    step, epoch = report.log.records()
    assert (step["kind"], step["epoch"], step["step"], step["loss"]) == ("step", 1, 2, 1.5)
    assert (epoch["kind"], epoch["val_accuracy"], epoch["train_loss"]) == ("epoch", 0.75, 0.5)
    assert (epoch["samples_per_s"], epoch["samples_per_s_per_rank"]) == (40.0, 10.0)
    assert "Epoch 1 - Avg Loss: 0.500000, Accuracy: 75.00% (validation)" in lines.messages
    other = _report(tmp_path / "rank1", rank=1)
    other.steps(window, 0.0, epoch=0, batch=2, total=5, step=2, lr=0.05)
    other.epoch(1, 5, Totals(10.0, 15, 20), Totals(2.0, 3, 4), seen=80.0, elapsed_s=2.0, lr=0.05)
    assert other.log.records() == []


def test_a_straggler_is_named_once_then_on_every_step_line_and_in_the_run_dir(
        tmp_path: Path, lines: pytest.LogCaptureFixture) -> None:
    import json

    from torchslurm.train.stragglers import RankTiming, Straggler

    report = _report(tmp_path, run_dir=tmp_path)
    gather = [RankTiming(5, 1.0, 0.0, 0.5)] * 3 + [RankTiming(5, 1.0, 0.0, 0.0)]
    named = [Straggler((3,), "node1", 2.0, False)]
    window = torch.tensor([6.0, 3.0, 4.0], dtype=torch.float64)
    report.step_times(10, gather, [], 15)
    report.step_times(15, gather, named, 15)
    report.step_times(20, gather, [Straggler((3,), "node1", 2.2, False)], 15)  # the same rank: no new warning
    report.steps(window, 0.0, epoch=0, batch=20, total=50, step=20, lr=0.05)
    text = "rank 3 on node1 2.0× the median compute time for the last 15 steps"
    said = list(dict.fromkeys(m for m in lines.messages if "straggler" in m))  # the handler sees each twice
    assert said == [f"straggler at step 15: {text}", "epoch 1 batch 20/50 step 20: loss 1.500000, lr 0.05, "
                    f"0 samples/s; straggler: {text.replace('2.0×', '2.2×')}"], said
    record, = report.log.records()  # the step record carries the last gather's numbers
    assert (record["kind"], record["step"], record["stragglers"], record["slowest_rank"]) == ("step", 20, 1, 3)
    assert record["named"][0]["text"] == text.replace("2.0×", "2.2×") and record["collective_s"] == 0.1
    assert json.loads((tmp_path / "stragglers.json").read_text())["named"][0]["text"] == text.replace("2.0×", "2.2×")
    report.step_times(25, gather, [], 15)
    assert lines.messages[-1] == "step 25: no straggler any more"
    assert json.loads((tmp_path / "stragglers.json").read_text())["named"] == []


def test_compile_seconds_are_left_out_of_the_rates_and_shown_beside_them(
        tmp_path: Path, lines: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from torchslurm.train import report as report_module

    # torch's compile seconds as read at: start, the step window, the epoch's training end, the epoch line (2 reads)
    spent = iter([2.0, 5.0, 5.0, 5.0, 5.0])
    monkeypatch.setattr(report_module, "compile_seconds", lambda: next(spent))
    report = _report(tmp_path, compile=True)
    report.start(1.0)
    assert "compile=true: 2.0 s compiling before the first step" in lines.messages
    clock, real, here = iter([10.0, 14.0]), report_module.time.perf_counter, threading.get_ident()
    # time is the module every thread uses: a thread left running by another test reads the real clock
    monkeypatch.setattr(report_module.time, "perf_counter",
                        lambda: next(clock) if threading.get_ident() == here else real())
    window = torch.tensor([28.0, 14.0, 28.0], dtype=torch.float64)  # 28 samples a rank, 4 ranks
    report.steps(window, 0.0, epoch=0, batch=2, total=5, step=2, lr=0.05)  # 10 s, 3 of them compiling
    assert "16 samples/s (+ 3.0 s compiling)" in lines.messages[-1]  # 112 samples / 7 s of stepping
    elapsed = report.trained(0.0)  # 14 s, the same 3 s of compiling in them
    report.epoch(1, 2, Totals(6.0, 3.0, 4.0), Totals(6.0, 3.0, 4.0), seen=110.0, elapsed_s=elapsed, lr=0.05)
    assert "(3.0 s of it compiling)" in lines.messages[-1]
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["compile_s"] == 3.0 and records[0]["samples_per_s"] == 16.0
    assert records[1]["compile_s"] == 3.0 and records[1]["samples_per_s"] == 10.0  # 110 / 11 s


def test_without_compile_nothing_is_subtracted_or_said(tmp_path: Path, lines: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from torchslurm.train import report as report_module

    monkeypatch.setattr(report_module, "compile_seconds", lambda: pytest.fail("read with compile off"))
    report = _report(tmp_path)
    report.start(1.0)
    report.steps(torch.tensor([28.0, 14.0, 28.0], dtype=torch.float64), 0.0, epoch=0, batch=2, total=5, step=2,
                 lr=0.05)
    assert "compiling" not in lines.messages[-1]
