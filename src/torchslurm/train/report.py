"""What a run says on rank 0: its opening lines, a progress bar on a terminal (plain step lines
otherwise), each epoch's lines, and the records of metrics.jsonl with the curves drawn from them.
Every method may be called on every rank; only rank 0 writes."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torchslurm.runtime.safefiles import replace
from torchslurm.train.compiling import compile_seconds
from torchslurm.train.metrics import Totals, totals
from torchslurm.train.stragglers import STRAGGLERS_FILE, RankTiming, Straggler, gather_record, summary

if TYPE_CHECKING:
    import torch

    from torchslurm.train.config import TrainConfig
    from torchslurm.train.metrics import CurvePlotter, MetricsLog
    from torchslurm.train.tasks import Task
    from torchslurm.train.topology import Topology

logger = logging.getLogger("torchslurm.train.trainer")  # the lines a run's log has always shown


class RunReport:
    """Rank 0's account of a run of `config` on `topo`, measuring what `task` measures."""

    def __init__(self, topo: Topology, config: TrainConfig, task: Task, log: MetricsLog,
                 curves: CurvePlotter) -> None:
        self.topo, self.config, self.task, self.log, self.curves = topo, config, task, log, curves
        self.stragglers = ""
        """The stragglers named at the last gather ('' for none), repeated on every progress line."""
        self._named: list[tuple[int, ...]] = []
        self._split: dict[str, Any] = {}
        """The last gather's numbers, added to each step record (metrics.jsonl keeps its two kinds of record)."""
        self._compiled = {"steps": 0.0, "epoch": 0.0}
        """compile=true: this process's compile seconds when the step window and the epoch began."""
        self._epoch_compile_s = 0.0
        """compile=true: the seconds of the last epoch's training spent compiling."""

    @property
    def is_main(self) -> bool:
        return self.topo.rank == 0

    def start(self, lr_factor: float) -> None:
        """Where the run trains and with what settings."""
        t, cfg = self.topo, self.config
        if cfg.compile:
            before = self._compile_since("steps")
            self._compiled["epoch"] = self._compiled["steps"]
        if not self.is_main:
            return
        if cfg.compile and before:
            logger.info("compile=true: %.1f s compiling before the first step", before)
        plural = "es" if t.world_size != 1 else ""
        logger.info("Starting distributed training on %d process%s (%d node%s × %d, %s, %s), master %s",
                    t.world_size, plural, t.num_nodes, "s" if t.num_nodes != 1 else "", t.local_world_size,
                    t.backend, t.device.type, t.master)
        logger.info("run_dir %s: %d epoch%s, batch_size %d per rank, lr %g%s, amp %s", cfg.run_dir, cfg.epochs,
                    "s" if cfg.epochs != 1 else "", cfg.batch_size, cfg.lr,
                    "" if cfg.lr_scaling == "none" else f" ({cfg.lr_scaling} scaling → {cfg.lr * lr_factor:g})",
                    cfg.amp)

    def progress_bar(self, epoch: int, batches_done: int, total: int) -> Any:
        """A tqdm bar on rank 0 when stdout is a terminal; None otherwise (plain lines instead)."""
        if not self.is_main or not sys.stdout.isatty():
            return None
        from tqdm import tqdm

        return tqdm(total=total, initial=batches_done, desc=f"epoch {epoch + 1}", leave=False, unit="batch",
                    dynamic_ncols=True)

    def steps(self, window: torch.Tensor, since: float, *, epoch: int, batch: int, total: int, step: int,
              lr: float) -> float:
        """The steps since `since` (a perf_counter time): a line and a record; returns now."""
        now = time.perf_counter()
        compiling = self._compile_since("steps")
        if self.is_main:
            t = totals(window)
            stepping = now - since - compiling
            rate = t.count * self.topo.world_size / stepping if stepping > 0 else 0.0
            flops = rate * self.task.flops_per_unit
            if not sys.stdout.isatty():
                logger.info("epoch %d batch %d/%d step %d: loss %.6f, lr %.3g, %.0f %s/s%s%s%s", epoch + 1, batch,
                            total, step, t.avg_loss, lr, rate, self.task.unit,
                            f", {flops:.3g} model FLOP/s (est.)" if flops else "",
                            f" (+ {compiling:.1f} s compiling)" if compiling else "",
                            f"; straggler: {self.stragglers}" if self.stragglers else "")
            self.log.append({"kind": "step", "epoch": epoch + 1, "step": step, "loss": t.avg_loss, "lr": lr,
                             f"{self.task.unit}_per_s": rate, **({"flops_per_s": flops} if flops else {}),
                             **({"compile_s": compiling} if compiling else {}), **self._split})
        return now

    def step_times(self, step: int, gather: Sequence[RankTiming], stragglers: Sequence[Straggler],
                   window_steps: int) -> None:
        """A gather of every rank's compute/wait split: its numbers go into the next step records of
        metrics.jsonl (and TensorBoard), run_dir's stragglers file for `torchslurm status` is rewritten, and
        a line is logged when who is named changes."""
        if not self.is_main:
            return
        record = gather_record(step, gather, stragglers, window_steps)
        self._split = {k: v for k, v in record.items() if k not in ("kind", "step")}
        path = self.config.run_dir / STRAGGLERS_FILE
        replace(path, json.dumps(record) + "\n")  # status reads it whole or not at all
        named = [s.ranks for s in stragglers]
        if named != self._named:  # who, not by how much: the ratio moves a little at every gather
            if named:
                logger.warning("straggler at step %d: %s", step, summary(stragglers, window_steps))
            else:
                logger.info("step %d: no straggler any more", step)
            self._named = named
        self.stragglers = summary(stragglers, window_steps)

    def trained(self, started: float) -> float:
        """The seconds since `started` (a perf_counter time), an epoch's training just ended; the compile
        seconds among them are kept for the epoch's line (validation compiles after this)."""
        elapsed = time.perf_counter() - started
        self._epoch_compile_s = self._compile_since("epoch")
        return elapsed

    def epoch(self, epoch: int, step: int, train: Totals, val: Totals, seen: float, elapsed_s: float,
              lr: float) -> None:
        """An epoch's lines and record (`seen`: the units all ranks trained), and the curves redrawn. The
        rate leaves out the epoch's compile time (compile=true), which is shown beside it."""
        compiling, self._epoch_compile_s = self._epoch_compile_s, 0.0
        self._compile_since("epoch")  # the next epoch's accounts start after this one's validation
        self._compile_since("steps")
        if not self.is_main:
            return
        stepping = elapsed_s - compiling
        rate = seen / stepping if stepping > 0 else 0.0  # units (samples, tokens) this run trained
        unit, per_rank = self.task.unit, rate / self.topo.world_size
        shown = f"{self.task.summary(val)} (validation)" if val.count else "no validation data"
        logger.info("Epoch %d - %s", epoch, shown)
        logger.info("  train %s, %.0f %s/s (%.0f per rank), %.1f s%s", self.task.summary(train).lower(), rate, unit,
                    per_rank, elapsed_s, f" ({compiling:.1f} s of it compiling)" if compiling else "")
        self.log.append({
            "kind": "epoch", "epoch": epoch, "step": step,
            **{f"train_{k}": v for k, v in self.task.metrics(train).items()},
            **{f"val_{k}": v for k, v in self.task.metrics(val).items()},
            f"val_{unit}": val.count, f"{unit}_per_s": rate, f"{unit}_per_s_per_rank": per_rank,
            **({"flops_per_s": rate * self.task.flops_per_unit} if self.task.flops_per_unit else {}),
            "epoch_time_s": elapsed_s, **({"compile_s": compiling} if compiling else {}), "lr": lr,
            **self._peak_memory(),
        })
        self.curves.update()

    def _compile_since(self, mark: str) -> float:
        """compile=true: seconds this process compiled since `mark` was last set ("steps" or "epoch"),
        which it now moves to now; 0.0 with compile off."""
        if not self.config.compile:
            return 0.0
        now = compile_seconds()
        spent, self._compiled[mark] = now - self._compiled[mark], now
        return spent

    def _peak_memory(self) -> dict[str, float]:
        """On CUDA: the most GPU memory rank 0's tensors have held so far (MiB), for an epoch record."""
        import torch

        if self.topo.device.type != "cuda":
            return {}
        return {"peak_gpu_memory_mib": torch.cuda.max_memory_allocated(self.topo.device) / 2**20}
