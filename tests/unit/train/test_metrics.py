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
    plot_curves,
    totals,
)
from torchslurm.train.tasks import classification


def test_batch_sums_weigh_the_mean_loss_by_the_batch_and_count_argmax_hits() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0]])
    target = torch.tensor([0, 0, 0])  # rows 0 and 2 are right
    sums = classification().sums(logits, target, torch.tensor(0.5))
    assert sums.dtype == torch.float64 and sums.tolist() == [1.5, 2.0, 3.0]


def test_batch_sums_count_no_hits_when_the_output_is_not_class_logits() -> None:
    regression = classification().sums(torch.zeros(4, 1, 3), torch.zeros(4, 3), torch.tensor(2.0))
    assert regression.tolist() == [8.0, 0.0, 4.0]


def test_totals_over_uneven_batches_are_the_dataset_mean() -> None:
    """Two batches of 3 and 1 samples: the mean over 4 samples, not the mean of the two batch means."""
    first = classification().sums(torch.tensor([[1.0, 0.0]] * 3), torch.tensor([0, 0, 1]), torch.tensor(1.0))
    second = classification().sums(torch.tensor([[0.0, 1.0]]), torch.tensor([1]), torch.tensor(5.0))
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


# -- what curves.png shows, read from the figure as it is saved ----------------------------------------------

@pytest.fixture
def saved(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, dict[str, Any]]]:
    """Each figure plot_curves saves, with savefig's keyword arguments; not rendered (that takes a second: the
    PNG itself is test_plot_curves_writes_a_png_named_after_the_run's)."""
    from matplotlib.figure import Figure

    figures: list[tuple[Any, dict[str, Any]]] = []

    def savefig(self: Figure, *args: Any, **kwargs: Any) -> None:
        figures.append((self, kwargs))

    monkeypatch.setattr(Figure, "savefig", savefig)
    return figures


def _panel(ax: Any) -> tuple[str, str, list[tuple[str, list[float], list[float], str]], list[str]]:
    """(title, x label, (label, x, y, marker) of each line, the legend's labels) of one subplot."""
    lines = [(line.get_label(), [float(v) for v in line.get_xdata()], [float(v) for v in line.get_ydata()],
              line.get_marker()) for line in ax.get_lines()]
    legend = ax.get_legend()
    return ax.get_title(), ax.get_xlabel(), lines, [] if legend is None else [t.get_text() for t in legend.get_texts()]


def _run_record(n: int, **extra: float) -> dict[str, Any]:
    return {"kind": "epoch", "epoch": n, "train_loss": 3.0 / n, "val_loss": 4.0 / n, **extra}


def test_curves_show_loss_accuracy_in_percent_and_throughput_per_epoch(tmp_path: Path, saved: list[Any]) -> None:
    records = [{"kind": "step", "step": 5, "train_loss": 9.0}] + [
        _run_record(n, train_accuracy=0.25 * n, val_accuracy=0.2 * n, samples_per_s=100.0 * n,
                    samples_per_s_per_rank=50.0 * n) for n in (1, 2)]
    run = tmp_path / "my-run"
    run.mkdir()
    plot_curves(records, run / "curves.png")
    ((fig, kwargs),) = saved
    assert kwargs == {"format": "png", "dpi": 90}
    assert (fig.get_suptitle(), tuple(fig.get_size_inches())) == ("my-run: 2 epoch(s)", (13.0, 3.9))
    assert [ax.get_subplotspec().get_geometry() for ax in fig.axes] == [(1, 3, 0, 0), (1, 3, 1, 1), (1, 3, 2, 2)]
    loss, accuracy, throughput = (_panel(ax) for ax in fig.axes)
    assert loss == ("loss", "epoch", [("train", [1, 2], [3.0, 1.5], "o"), ("validation", [1, 2], [4.0, 2.0], "o")],
                    ["train", "validation"])
    assert accuracy == ("accuracy (%)", "epoch", [("train", [1, 2], [25.0, 50.0], "o"),
                                                  ("validation", [1, 2], [20.0, 40.0], "o")], ["train", "validation"])
    assert throughput == ("throughput (samples/s)", "epoch", [("global", [1, 2], [100.0, 200.0], "o"),
                                                              ("per rank", [1, 2], [50.0, 100.0], "o")],
                          ["global", "per rank"])
    for ax in fig.axes:  # whole epochs only on the x axis
        assert list(ax.xaxis.get_major_locator().tick_values(1, 2)) == [1.0, 2.0]


def test_curves_of_a_language_model_show_its_own_metric_and_tokens(tmp_path: Path, saved: list[Any]) -> None:
    records = [_run_record(n, train_perplexity=30.0 / n, val_perplexity=40.0 / n, tokens_per_s=1e4 * n,
                           tokens_per_s_per_rank=5e3 * n) for n in (1, 2, 3)]
    plot_curves(records, tmp_path / "curves.png")
    ((fig, _),) = saved
    _, metric, throughput = (_panel(ax) for ax in fig.axes)
    assert metric == ("perplexity", "epoch", [("train", [1, 2, 3], [30.0, 15.0, 10.0], "o"),
                                              ("validation", [1, 2, 3], [40.0, 20.0, 40.0 / 3], "o")],
                      ["train", "validation"])
    assert throughput[0] == "throughput (tokens/s)" and throughput[2][0][2] == [1e4, 2e4, 3e4]


def test_curves_without_a_second_metric_leave_its_panel_empty(tmp_path: Path, saved: list[Any]) -> None:
    """A validation-only metric (no train_ twin) is not a second metric either."""
    records = [_run_record(n, val_bleu=0.3, samples_per_s=10.0, samples_per_s_per_rank=5.0) for n in (1, 2)]
    plot_curves(records, tmp_path / "curves.png")
    ((fig, _),) = saved
    assert _panel(fig.axes[1]) == ("", "", [], [])
    plot_curves([{"kind": "step", "step": 1}], tmp_path / "none.png")  # no epoch yet: nothing drawn
    assert len(saved) == 1 and not (tmp_path / "none.png").exists()


def test_curves_of_a_one_epoch_run_read_its_only_record(tmp_path: Path, saved: list[Any]) -> None:
    """A smoke run of one epoch: the metric and the throughput unit come from the last epoch, its only one."""
    records = [_run_record(1, train_perplexity=30.0, val_perplexity=40.0, tokens_per_s=1e4,
                           tokens_per_s_per_rank=5e3)]
    plot_curves(records, tmp_path / "curves.png")
    ((fig, _),) = saved
    assert fig.get_suptitle() == f"{tmp_path.name}: 1 epoch(s)"
    _, metric, throughput = (_panel(ax) for ax in fig.axes)
    assert metric == ("perplexity", "epoch", [("train", [1], [30.0], "o"), ("validation", [1], [40.0], "o")],
                      ["train", "validation"])
    assert throughput == ("throughput (tokens/s)", "epoch", [("global", [1], [1e4], "o"),
                                                             ("per rank", [1], [5e3], "o")], ["global", "per rank"])


class _Trackers:
    """What MetricsLog hands its W&B/MLflow runs (train.trackers.Trackers' interface)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def start(self) -> None:
        self.calls.append(("start", None))

    def write(self, record: Mapping[str, Any]) -> None:
        self.calls.append(("write", dict(record)))

    def close(self, failed: bool) -> None:
        self.calls.append(("close", failed))


def test_the_trackers_runs_last_while_the_log_is_entered_and_end_failed_when_the_training_raised(
        tmp_path: Path) -> None:
    trackers = _Trackers()
    with MetricsLog(tmp_path / "metrics.jsonl", trackers=trackers) as log:  # type: ignore[arg-type]
        log.append({"kind": "step", "step": 1})
    assert trackers.calls == [("start", None), ("write", {"kind": "step", "step": 1}), ("close", False)]
    trackers.calls.clear()
    with pytest.raises(RuntimeError, match="diverged"), \
            MetricsLog(tmp_path / "metrics.jsonl", trackers=trackers):  # type: ignore[arg-type]
        raise RuntimeError("diverged")
    assert trackers.calls == [("start", None), ("close", True)]
    trackers.calls.clear()
    MetricsLog(tmp_path / "metrics.jsonl", trackers=trackers).close()  # type: ignore[arg-type]
    assert trackers.calls == [("close", False)]


class _Events:
    """What MetricsLog hands its TensorBoard writer (train.events.EventWriter's interface)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def write(self, record: Mapping[str, Any]) -> None:
        self.calls.append(("write", dict(record)))

    def purge(self, step: int) -> None:
        self.calls.append(("purge", step))

    def close(self) -> None:
        self.calls.append(("close", None))


def test_the_log_hands_every_record_to_its_event_writer_and_purges_what_a_resume_redoes(tmp_path: Path) -> None:
    events = _Events()
    log = MetricsLog(tmp_path / "new" / "run" / "metrics.jsonl", events)  # type: ignore[arg-type]
    log.append({"kind": "step", "step": 1})
    log.append({"kind": "epoch", "epoch": 1})  # an epoch record without a step: step 0, kept by any resume
    log.keep_until(1)
    assert [r.get("step") for r in log.records()] == [1, None]
    log.keep_until(0)
    log.close()
    assert events.calls == [("write", {"kind": "step", "step": 1}), ("write", {"kind": "epoch", "epoch": 1}),
                            ("purge", 2), ("purge", 0), ("close", None)]
    fresh = MetricsLog(tmp_path / "other" / "run" / "metrics.jsonl")
    fresh.keep_until(5)  # its folder is made, as append makes it
    assert fresh.records() == [] and fresh.path.exists()


class _FakeDist:
    """torch.distributed as all_reduce_sums sees it in a group of `world` ranks."""

    ReduceOp = torch.distributed.ReduceOp

    def __init__(self, world: int) -> None:
        self.world, self.calls = world, []  # type: list[tuple[list[float], object]]

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_world_size(self) -> int:
        return self.world

    def all_reduce(self, tensor: torch.Tensor, op: object = None) -> None:
        self.calls.append((tensor.tolist(), op))
        tensor.mul_(self.world)  # every rank had the same sums


@pytest.mark.parametrize("world", [1, 2, 3])
def test_sums_are_added_over_the_ranks_only_when_there_are_peers(monkeypatch: pytest.MonkeyPatch, world: int) -> None:
    from torchslurm.train import metrics

    fake = _FakeDist(world)
    monkeypatch.setattr(metrics, "dist", fake)
    sums = all_reduce_sums(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    assert sums.tolist() == [world * 1.0, world * 2.0, world * 3.0]
    assert fake.calls == ([] if world == 1 else [([1.0, 2.0, 3.0], torch.distributed.ReduceOp.SUM)])


def test_batch_sums_of_soft_targets_count_no_hits_and_stay_on_the_batchs_device() -> None:
    soft = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # one-hot rows: what argmax hits would be compared with
    sums = classification().sums(torch.tensor([[2.0, 1.0], [0.0, 3.0]]), soft, torch.tensor(0.5))
    assert sums.tolist() == [1.0, 0.0, 2.0]
    meta = classification().sums(torch.empty(4, 3, device="meta"), torch.empty(4, dtype=torch.long, device="meta"),
                      torch.empty((), device="meta"))
    assert meta.device.type == "meta"  # no copy to the host: the sums are read after the epoch


def test_totals_read_the_first_three_sums() -> None:
    assert totals(torch.tensor([3.0, 1.0, 4.0, 99.0], dtype=torch.float64)) == Totals(3.0, 1, 4)


def test_a_plotter_draws_at_the_default_interval_in_daemon_threads_and_its_last_draw_in_a_plain_one(
        tmp_path: Path) -> None:
    """Each draw runs in a thread named torchslurm-curves; those during training are daemons (an exiting run does
    not wait for them), the last one is not (rank 0 finishes curves.png before its process exits)."""
    records = [_epoch(1)]
    seen: list[tuple[str, bool, Path]] = []
    clock = _Clock()
    clock.now = 1000.0  # the interval counts from the plotter's start, not from 0
    plotter = CurvePlotter(tmp_path / "curves.png", lambda: records, clock=clock, draw=lambda recs, path: seen.append(
        (threading.current_thread().name, threading.current_thread().daemon, path)))
    plotter.close()
    plotter.wait()
    assert seen == []  # nothing new since the start: nothing to draw
    clock.now = 1299.0
    plotter.update()
    plotter.wait()
    assert seen == []  # 299 s: not yet
    clock.now = 1300.0
    plotter.update()  # 300 s, the default interval
    plotter.wait()
    plotter.close()  # nothing new since that draw
    plotter.wait()
    records.append(_epoch(2))
    plotter.update()  # new records, but the last draw was just now: left to the end
    plotter.close()
    plotter.wait()
    assert seen == [("torchslurm-curves", True, tmp_path / "curves.png"),
                    ("torchslurm-curves", False, tmp_path / "curves.png")]


def test_a_draw_in_flight_is_neither_doubled_nor_overtaken(tmp_path: Path) -> None:
    """While one draw runs an update only remembers the new records; the final draw starts after it, so two
    draws never write curves.png at once."""
    records = [_epoch(1)]
    release, second = threading.Event(), threading.Event()
    order: list[str] = []

    def draw(recs: list[Mapping[str, Any]], _: Path) -> None:
        order.append(f"start {len(recs)}{'' if threading.current_thread().daemon else ' (final)'}")
        if len(recs) == 1:
            release.wait(10)
        else:
            second.set()
        order.append(f"end {len(recs)}")

    clock = _Clock()
    plotter = CurvePlotter(tmp_path / "curves.png", lambda: list(records), min_interval_s=60, clock=clock, draw=draw)
    clock.now = 60
    plotter.update()
    records.append(_epoch(2))
    clock.now = 500
    plotter.update()  # busy: remembered, not drawn
    plotter.close()  # the final draw waits for the first
    second.wait(0.2)  # a final draw that did not wait would have run by now
    release.set()
    plotter.wait()
    assert order == ["start 1", "end 1", "start 2 (final)", "end 2"]  # drawn by close(), not by the busy update


def test_a_failing_draw_is_logged_with_the_file_and_the_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def broken(recs: list[Mapping[str, Any]], path: Path) -> None:
        raise OSError("No space left on device")

    plotter = CurvePlotter(tmp_path / "curves.png", lambda: [_epoch(1)], draw=broken)
    plotter.update()
    plotter.close()
    plotter.wait()
    assert caplog.messages == [f"could not draw {tmp_path / 'curves.png'} (training is not affected): OSError: No "
                               "space left on device"]
