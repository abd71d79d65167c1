"""Exact distributed metrics, the metrics.jsonl log, and curves.png.

Exactness: each rank sums (loss·n, correct, n) over the samples it saw — validation shards
never pad — and one float64 all_reduce adds the sums, so the result is the metric over the
whole dataset, whatever the world size.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from torchslurm.runtime.safefiles import open_append, replace
from torchslurm.train.events import EventWriter

if TYPE_CHECKING:
    from torchslurm.train.trackers import Trackers

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Totals:
    """Sums over a dataset: loss·n, correct predictions, samples."""

    loss_sum: float
    correct: int
    count: int

    @property
    def avg_loss(self) -> float:
        return self.loss_sum / self.count if self.count else float("nan")

    @property
    def accuracy(self) -> float:
        """Fraction in [0, 1]."""
        return self.correct / self.count if self.count else float("nan")


def all_reduce_sums(sums: torch.Tensor) -> torch.Tensor:
    """Sum a float64 vector over all ranks (a no-op without a process group)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    return sums


def totals(sums: torch.Tensor) -> Totals:
    loss_sum, correct, count = sums[:3].tolist()
    return Totals(loss_sum=float(loss_sum), correct=round(correct), count=round(count))


class MetricsLog:
    """`<run_dir>/metrics.jsonl`: one JSON record per line, appended and flushed at once; with
    `events`, each record's numbers also go to TensorBoard event files, and with `trackers` to W&B and
    MLflow (train.trackers), whose runs last while the log is entered (`with log:`, fit)."""

    def __init__(self, path: Path, events: EventWriter | None = None, trackers: Trackers | None = None) -> None:
        self.path = Path(path)
        self.events, self.trackers = events, trackers

    def __enter__(self) -> MetricsLog:
        if self.trackers is not None:
            self.trackers.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.close(failed=exc_type is not None)

    def append(self, record: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open_append(self.path) as f:
            f.write(json.dumps(dict(record)) + "\n")
        if self.events is not None:
            self.events.write(record)
        if self.trackers is not None:
            self.trackers.write(record)

    def close(self, failed: bool = False) -> None:
        """Close the event file, and end the tracker runs (as failed when `failed`)."""
        if self.events is not None:
            self.events.close()
        if self.trackers is not None:
            self.trackers.close(failed)

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def keep_until(self, step: int) -> None:
        """Drop records written after optimizer step `step`: a resumed run re-does that work."""
        kept = [r for r in self.records() if int(r.get("step", 0)) <= step] if step > 0 else []
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        if self.events is not None:
            self.events.purge(step + 1 if step > 0 else 0)


def plot_curves(records: Iterable[Mapping[str, Any]], path: Path) -> None:
    """Loss and accuracy per epoch, and throughput, into one PNG titled with the run's folder.

    matplotlib's object API, not pyplot: it keeps no global state, so a background thread may draw."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    epochs = [r for r in records if r.get("kind") == "epoch"]
    if not epochs:
        return
    x = [r["epoch"] for r in epochs]
    fig = Figure(figsize=(13, 3.9))
    ax_loss, ax_acc, ax_tput = fig.subplots(1, 3)
    fig.suptitle(f"{Path(path).resolve().parent.name}: {len(epochs)} epoch(s)")
    ax_loss.plot(x, [r["train_loss"] for r in epochs], marker="o", label="train")
    ax_loss.plot(x, [r["val_loss"] for r in epochs], marker="o", label="validation")
    ax_loss.set(title="loss", xlabel="epoch")
    ax_loss.legend()
    # the task's second metric (accuracy, perplexity, ...) and its throughput unit (samples, tokens)
    metric = next((k[len("val_"):] for k in epochs[-1] if k.startswith("val_") and k != "val_loss"
                   and f"train_{k[len('val_'):]}" in epochs[-1]), None)
    if metric is not None:
        scale = 100 if metric == "accuracy" else 1
        ax_acc.plot(x, [scale * r[f"train_{metric}"] for r in epochs], marker="o", label="train")
        ax_acc.plot(x, [scale * r[f"val_{metric}"] for r in epochs], marker="o", label="validation")
        ax_acc.set(title="accuracy (%)" if metric == "accuracy" else metric, xlabel="epoch")
        ax_acc.legend()
    unit = "tokens" if "tokens_per_s" in epochs[-1] else "samples"
    ax_tput.plot(x, [r[f"{unit}_per_s"] for r in epochs], marker="o", label="global")
    ax_tput.plot(x, [r[f"{unit}_per_s_per_rank"] for r in epochs], marker="o", label="per rank")
    ax_tput.set(title=f"throughput ({unit}/s)", xlabel="epoch")
    ax_tput.legend()
    for ax in (ax_loss, ax_acc, ax_tput):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=90)
    replace(Path(path), image.getvalue())


class CurvePlotter:
    """curves.png kept current off the training path. Drawing costs 0.3-2 s of CPU (importing
    matplotlib first); done at each epoch end on rank 0, every other rank would wait for it at the
    next collective. So it is drawn in a background thread, at most every `min_interval_s` during
    training and once more after the last epoch; that last draw is not waited for by `close()`:
    rank 0 finishes it before its process exits (the thread is not a daemon), while fit returns at
    once and no rank waits. A failed draw is a warning: a plot never stops training."""

    def __init__(self, path: Path, records: Callable[[], Iterable[Mapping[str, Any]]],
                 min_interval_s: float = 300.0, clock: Callable[[], float] = time.monotonic,
                 draw: Callable[[list[Mapping[str, Any]], Path], None] = plot_curves) -> None:
        self.path, self.min_interval_s = path, min_interval_s
        self._records, self._clock, self._draw = records, clock, draw
        self._last = clock()  # nothing in the first interval: a short run draws once, at the end
        self._stale = False
        self._thread: threading.Thread | None = None

    def update(self) -> None:
        """New records exist; drawn now in the background if the last draw is old and finished.
        The records are read only when a draw starts."""
        self._stale = True
        busy = self._thread is not None and self._thread.is_alive()
        if not busy and self._clock() - self._last >= self.min_interval_s:
            self._start(final=False)

    def close(self) -> None:
        """Draw what no draw included yet, after the one in flight, without waiting for it."""
        if self._stale:
            self._start(final=True)

    def wait(self) -> None:
        """Until the newest draw has finished (tests; a caller that reads curves.png next)."""
        if self._thread is not None:
            self._thread.join()

    def _start(self, final: bool) -> None:
        previous = self._thread
        self._stale, self._last = False, self._clock()

        def draw() -> None:
            if previous is not None:
                previous.join()
            self._draw_safely(list(self._records()))

        self._thread = threading.Thread(target=draw, daemon=not final, name="torchslurm-curves")
        self._thread.start()

    def _draw_safely(self, records: list[Mapping[str, Any]]) -> None:
        try:
            self._draw(records, self.path)
        except Exception as exc:  # matplotlib missing or broken, disk full: the run is worth more than its plot
            logger.warning("could not draw %s (training is not affected): %s: %s", self.path,
                           type(exc).__name__, exc)
