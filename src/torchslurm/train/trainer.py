"""TrainConfig + Trainer: the small DDP loop of a classic training script, with exact metrics, atomic
checkpoints and a bitwise-exact resume.

Determinism: the order of the training data is a pure function of (seed, epoch) — the DistributedSampler's
permutation and the DataLoader's own generator — so a resume replays the epoch and skips the batches already
done; every rank's RNG states travel in the checkpoint. Checkpoints are taken only at optimizer-step boundaries.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from torchslurm.errors import ConfigError
from torchslurm.jobs.rundir import remember
from torchslurm.jobs.slurm import run_command_status
from torchslurm.runtime.distributed import stack_watch
from torchslurm.train.batches import to_device
from torchslurm.train.checkpoint.checkpointer import Checkpointer, TrainProgress
from torchslurm.train.checkpoint.layout import CHECKPOINTS
from torchslurm.train.config import TrainConfig, device_problem, resume_problem
from torchslurm.train.data import epoch_batches
from torchslurm.train.events import EventWriter
from torchslurm.train.hang import hang_watch
from torchslurm.train.metrics import CurvePlotter, MetricsLog, Totals, all_reduce_sums, totals
from torchslurm.train.outcome import RunOutcome, requeued
from torchslurm.train.preemption import Preemption, PreemptionConfig, preemption_config
from torchslurm.train.preflight import data_problem, optimizer_problem, run_dir_problem
from torchslurm.train.report import RunReport
from torchslurm.train.requeue import Runner, requeues_after_failure
from torchslurm.train.rng import make_repeatable, rng_state, seed_everything, set_rng_state
from torchslurm.train.step import Step, Stepper
from torchslurm.train.steptime import StepTimes, node_name
from torchslurm.train.strategy import make_scaler, make_strategy, restore_scaler
from torchslurm.train.tasks import Task, classification, loss_only
from torchslurm.train.topology import topology
from torchslurm.train.trackers import installed_problem, run_trackers
from torchslurm.train.validation import Validator
from torchslurm.train.watchdog import Watchdog

if TYPE_CHECKING:
    from torchslurm.runtime.distributed import DistContext

__all__ = ["FitResult", "TrainConfig", "Trainer", "seed_everything"]

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class FitResult:
    """What `Trainer.fit` did."""

    stopped_early: bool
    """True when should_stop() asked to stop; a checkpoint was saved first."""
    epochs_done: int
    global_step: int
    val: Totals | None
    """Validation totals of the last finished epoch in this run."""
    checkpoint: Path | None
    """The last checkpoint this run wrote (rank 0 knows it; other ranks see None)."""
    run_dir: Path = field(default=Path("."))
    exit_code: int = 0
    """0, or PREEMPTED_EXIT_CODE (75) after the built-in preemption stopped the run and requeued
    the job: exit with it (`sys.exit(result.exit_code)`) so that the job script can tell."""


class Trainer:
    """Train `model` with DDP on every rank of the current process group.

    `optimizer` must hold the model's parameters (checked here); its lr is set from the config.
    `scheduler` is a factory called with the optimizer and stepped after each optimizer step. A batch
    (what the DataLoader yields, through `collate_fn` when given) becomes a loss in `step(model,
    batch)` (default: `loss_fn(model(input), target)` for pairs, the Hugging Face convention for dicts;
    train.step), and `task` says what its metrics are (default: classification; loss only with a step).
    Left at None, `should_stop` is torchslurm's own preemption and `fit()` also runs the dead-peer
    watchdog: the job's warning signal (USR2), SIGTERM or its deadline stop every rank after the
    same step, the Trainer checkpoints, rank 0 requeues the job and FitResult.exit_code is 75; a
    dead peer ends every rank with one message naming it (torchslurm.train.preemption, .watchdog).
    A `should_stop` of your own is called on every rank at each optimizer-step boundary and must
    give the same answer on all ranks; when true, the Trainer saves a checkpoint and returns
    FitResult(stopped_early=True), and the rest is yours.

    The job is handed in as data: `environ` (the launcher's and Slurm's variables: placement
    without `ctx`, the job to requeue, the preemption settings) and `preemption` (default: read
    from `environ`; then, without an end time there, rank 0 asks Slurm for the job's end time
    through `run` when fit() starts).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: Callable[..., torch.Tensor] | None,
                 train_data: Dataset[Any], val_data: Dataset[Any] | None, config: TrainConfig, *,
                 ctx: DistContext | None = None,
                 scheduler: Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler] | None = None,
                 should_stop: Callable[[], bool] | None = None, preemption: PreemptionConfig | None = None,
                 environ: Mapping[str, str] | None = None, run: Runner = run_command_status,
                 task: Task | None = None, step: Step | None = None,
                 collate_fn: Callable[[list[Any]], Any] | None = None) -> None:
        environ = os.environ if environ is None else environ
        ConfigError.raise_any([run_dir_problem(config.run_dir, keep_created=True), optimizer_problem(model, optimizer),
                               data_problem(train_data, val_data), resume_problem(config.resume, config.run_dir),
                               installed_problem(config.trackers, config.mlflow_uri)])  # before any rank trains
        self.config, self.topo = config, topology(ctx, environ)
        self.device = self.topo.device
        ConfigError.raise_any([device_problem(config, self.device.type)])
        make_repeatable(config.deterministic)
        self.model = model.to(self.device)
        self.strategy = make_strategy(self.model, optimizer, config, self.topo)
        self.train_module = self.strategy.train_module  # what training calls: the model, or its DDP wrapper
        self.task = task or (loss_only() if step else classification())
        self.optimizer, self.loss_fn, self.collate_fn = optimizer, loss_fn, collate_fn
        self.stepper = Stepper(self.task, loss_fn, step, self.topo.rank, config.amp, self.device.type)
        self.train_data, self.val_data = train_data, Subset(train_data, []) if val_data is None else val_data
        self.lr_factor = config.lr_factor(self.topo.world_size)
        for group in optimizer.param_groups:
            group["lr"] = config.lr * self.lr_factor
        self.scheduler = scheduler(optimizer) if scheduler else None
        self.scaler = make_scaler(config.amp, self.device.type)
        self._ctx, self._environ = ctx, environ
        self.steptime = StepTimes(self.model, self.topo, node_name(environ), every=config.straggler_every,
                                  window=config.straggler_window, threshold=config.straggler_threshold,
                                  time_gradient_sync=self.strategy.syncs_in_backward)
        self._preemption: Preemption | None = None
        if should_stop is None:
            self._preemption = Preemption(preemption or preemption_config(environ), environ=environ, run=run,
                                          ask_deadline=preemption is None and self.is_main)
            should_stop = self._preemption.should_stop
        self.should_stop: Callable[[], bool] = should_stop
        self.hang = hang_watch(ctx, config.hang_timeout_s, config.hang_action, config.run_dir, on_hang=(
            self._preemption.requeue_after_failure if self._preemption and ctx and requeues_after_failure(ctx.env)
            else None))
        self.log = MetricsLog(config.run_dir / "metrics.jsonl",
                              EventWriter(config.run_dir / "tensorboard") if self.is_main else None,
                              run_trackers(config.to_dict(), environ) if self.is_main else None)
        self.curves = CurvePlotter(config.run_dir / "curves.png", self.log.records)
        self.report = RunReport(self.topo, config, self.task, self.log, self.curves)
        self.validator = Validator(self.strategy, self.stepper, self.topo, config.batch_size, config.seed,
                                   self._loading(), beat=self.hang.beat)
        self.epoch, self.batches_done, self.global_step = 0, 0, 0
        self._sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # this epoch, this rank
        self.checkpointer = Checkpointer(
            self.checkpoint_dir, self.model, optimizer, rank=self.topo.rank, world_size=self.topo.world_size,
            keep_last=config.keep_last, config=config.to_dict(), background=config.checkpoint_async,
            order={"world_size": self.topo.world_size, "batch_size": config.batch_size, "seed": config.seed,
                   "grad_accum_steps": config.grad_accum_steps}, environ=environ)

    @property
    def is_main(self) -> bool:
        return self.topo.rank == 0

    # ---- the loop ---------------------------------------------------------------------------
    def fit(self) -> FitResult:
        """Train for config.epochs (resuming first, as config.resume says); outcome.json says how it ended."""
        with RunOutcome(self.config.run_dir, self.topo.rank, lambda: (self.epoch, self.global_step)) as outcome, \
                ExitStack() as stack:
            if self.is_main:
                stack.callback(self.curves.close)
                stack.enter_context(self.log)  # the tracker runs end as failed when fit raises
            stack.callback(self.steptime.close)
            if self._preemption is not None:
                self._protect(stack, self._preemption)
            stack.enter_context(self.hang)
            if (watch := stack_watch()) is not None:
                watch.add(self.config.run_dir)  # `torchslurm stacks --run-dir` reaches the ranks
            try:
                result = self._fit()
                self.checkpointer.finish()
            finally:
                self.checkpointer.close()  # a preemption stop or the end: the requeued job finds it complete
            if result.stopped_early and self._preemption is not None:
                result = replace(result, exit_code=self._preemption.finish(self.topo.rank))
            outcome.ended(result.stopped_early, requeued(self._preemption))
        return result

    def _protect(self, stack: ExitStack, preemption: Preemption) -> None:
        """Signal handlers for the run, and across ranks the watchdog's heartbeat and guard."""
        stack.enter_context(preemption)
        if self._ctx is not None and self._ctx.world_size > 1:
            requeue = preemption.requeue_after_failure if requeues_after_failure(self._ctx.env) else None
            dog = stack.enter_context(Watchdog(self._ctx, bound_s=self._ctx.timeout_s, on_failure=requeue,
                                               on_node_fault=preemption.exclude_after_failure))
            stack.enter_context(dog.guard())

    def _fit(self) -> FitResult:
        self.strategy.settle(self._backward_once, self.optimizer)  # before the streams are seeded or restored
        self.checkpointer.open()  # before the first step: the epoch-end saves are written beside validation
        with self.hang.paused():
            if not self.restore():
                seed_everything(self.config.seed + self.topo.rank)  # per-rank dropout streams
        self.report.start(self.lr_factor)
        if self.is_main:
            remember(self.config.run_dir, self._environ)  # `torchslurm status JOB` finds the run's files
        val: Totals | None = None
        if self.epoch >= self.config.epochs and self.is_main:
            logger.info("%s already holds all %d epochs: nothing to train (set epochs above %d to "
                        "train more, or resume to never to start over)", self.config.run_dir, self.epoch, self.epoch)
        while self.epoch < self.config.epochs:
            started = time.perf_counter()
            seen = self._train_epoch()
            if seen is None:
                if self.checkpointer.saved_step != self.global_step:  # not just saved by checkpoint_every_steps
                    self.save(last=True)
                if self.is_main:
                    logger.info("stopping early at epoch %d step %d", self.epoch + 1, self.global_step)
                return FitResult(True, self.epoch, self.global_step, val, self.checkpointer.last,
                                 self.config.run_dir)
            val = self._finish_epoch(seen, self.report.trained(started))
        if val is None:  # resumed a finished run: still report its validation metrics
            val = self.evaluate()
        return FitResult(False, self.epoch, self.global_step, val, self.checkpointer.last, self.config.run_dir)

    def _backward_once(self) -> None:
        """A forward and backward of the first batch, its gradients thrown away (Strategy.settle)."""
        batch = next(iter(DataLoader(self.train_data, batch_size=self.config.batch_size, collate_fn=self.collate_fn)))
        loss = self.stepper.forward(self.train_module, to_device(batch, self.device)).loss
        loss.backward()  # type: ignore[no-untyped-call]

    def _train_epoch(self) -> int | None:
        """One epoch from self.batches_done on; samples seen, or None when should_stop() said so."""
        cfg = self.config
        loader = self._train_loader()
        total = self.batches_done + len(loader)
        accum, seen = cfg.grad_accum_steps, 0
        window = torch.zeros(3, dtype=torch.float64, device=self.device)
        tick = time.perf_counter()
        self.train_module.train()
        bar = self.report.progress_bar(self.epoch, self.batches_done, total)
        for batch in self.steptime.timed(loader):
            batch = to_device(batch, self.device, non_blocking=True)
            group_start = self.batches_done - self.batches_done % accum
            group_size = min(accum, total - group_start)
            self.batches_done += 1
            boundary = self.batches_done % accum == 0 or self.batches_done == total
            sums, units = self._micro_step(batch, group_size, boundary)
            self._sums += sums
            if cfg.log_every:
                window += sums
            seen += units
            if bar is not None:
                bar.update(1)
            if not boundary:
                continue
            self._optimizer_step()
            self.hang.step_done()
            if (gather := self.steptime.step_done(self.global_step)) is not None:
                self.report.step_times(self.global_step, gather, self.steptime.stragglers, self.steptime.window_steps)
            if cfg.log_every and self.global_step % cfg.log_every == 0:
                tick = self.report.steps(window, tick, epoch=self.epoch, batch=self.batches_done, total=total,
                                         step=self.global_step, lr=self.optimizer.param_groups[0]["lr"])
                window.zero_()
            if cfg.checkpoint_every_steps and self.global_step % cfg.checkpoint_every_steps == 0 \
                    and self.batches_done < total:
                self.save()
            if self.should_stop():
                if bar is not None:
                    bar.close()
                return None
        if bar is not None:
            bar.close()
        return seen

    def _micro_step(self, batch: Any, group_size: int, boundary: bool) -> tuple[torch.Tensor, int]:
        """Forward and backward of one batch; its [loss·n, correct, n] and n. The loss is divided by the
        micro-steps of its accumulation group, so the summed gradient is their mean."""
        with self.strategy.accumulate(boundary):  # gradients accumulate locally; synced on the boundary
            found = self.stepper.forward(self.train_module, batch)
            scaled: torch.Tensor = self.scaler.scale(found.loss / group_size if group_size > 1 else found.loss)
            scaled.backward()  # type: ignore[no-untyped-call]
        self.steptime.backward_done()
        return self.stepper.sums(found), found.n

    def _optimizer_step(self) -> None:
        if self.config.grad_clip:
            self.scaler.unscale_(self.optimizer)
            self.strategy.clip(self.config.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        self.global_step += 1

    def _train_loader(self) -> DataLoader[Any]:
        cfg = self.config
        return epoch_batches(self.train_data, cfg.batch_size, self.topo.rank, self.topo.world_size, cfg.seed,
                             self.epoch, self.batches_done, **self._loading())

    def _loading(self) -> dict[str, Any]:
        """The DataLoader options of training and validation alike."""
        return {"num_workers": self.config.num_workers, "collate_fn": self.collate_fn,
                "pin_memory": self.config.pin_memory and self.device.type == "cuda"}

    def evaluate(self, dataset: Dataset[Any] | None = None) -> Totals:
        """Exact loss and accuracy over `dataset` (default: the validation data), all ranks together.
        Every rank must call it."""
        return totals(all_reduce_sums(self._validation_sums(dataset)))

    def _validation_sums(self, dataset: Dataset[Any] | None) -> torch.Tensor:
        """This rank's sums over its shard of `dataset` (default: the validation data), the random
        streams put back as they were (train.validation)."""
        return self.validator.sums(self.val_data if dataset is None else dataset)

    def _finish_epoch(self, seen: int, elapsed_s: float) -> Totals:
        """Validate, reduce the epoch's sums, log the per-epoch line, write metrics and plot; the
        epoch's checkpoint, when one is due, is written meanwhile in the background (validation
        changes neither model nor optimizer, nor the random streams: train.validation), so an
        epoch end costs what validation costs (a small state is written first: Checkpointer.beside).
        Validation's and training's sums travel in one all_reduce: the epoch end's only collective
        on the training thread."""
        local_train = torch.cat([self._sums, torch.tensor([float(seen)], dtype=torch.float64, device=self.device)])
        self.epoch, self.batches_done = self.epoch + 1, 0
        self._sums.zero_()
        last = self.epoch == self.config.epochs
        with self.checkpointer.beside(self.progress(), last) if self._checkpoint_due() else nullcontext():
            return self._report_epoch(local_train, elapsed_s)

    def _report_epoch(self, local_train: torch.Tensor, elapsed_s: float) -> Totals:
        local_val = self._validation_sums(None)
        n = local_val.numel()
        reduced = all_reduce_sums(torch.cat([local_val, local_train]))
        val, train, seen_all = totals(reduced[:n]), totals(reduced[n:2 * n]), float(reduced[2 * n])
        self.report.epoch(self.epoch, self.global_step, train, val, seen_all, elapsed_s,
                          self.optimizer.param_groups[0]["lr"])
        return val

    def _checkpoint_due(self) -> bool:
        every = self.config.checkpoint_every_epochs
        return self.epoch == self.config.epochs or (every > 0 and self.epoch % every == 0)

    # ---- checkpoints ------------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        return self.config.run_dir / CHECKPOINTS

    def progress(self) -> TrainProgress:
        """Where the run stands now, as a checkpoint records it (call it at a step boundary)."""
        return TrainProgress(self.epoch, self.batches_done, self.global_step, self._sums.tolist(), rng_state(),
                             self.scaler.state_dict(), self.scheduler.state_dict() if self.scheduler else {})

    def save(self, last: bool = False) -> Path | None:
        """Checkpoint at the current step boundary (every rank writes its own files; train.checkpoint).
        Every rank must call it. With checkpoint_async the tensors are copied to CPU memory here and written
        in the background (after the previous background save, if one is in flight); the returned folder is
        complete once `wait_for_checkpoint()` returns. `last`: the run ends after it (Checkpointer.save)."""
        with self.hang.paused():
            return self.checkpointer.save(self.progress(), last)

    def wait_for_checkpoint(self) -> None:
        """Return once a background save is complete (at once without one); raise its error."""
        self.checkpointer.wait()

    def restore(self) -> bool:
        """Load model, optimizer, position and RNG states from the checkpoint config.resume names, as
        fit() does first; False when there is none (a fresh start). Every rank must call it."""
        progress = self.checkpointer.restore(self.config.resume)
        if self.is_main:
            self.log.keep_until(progress.global_step if progress else 0)
        if progress is None:
            return False
        restore_scaler(self.scaler, progress.scaler)
        if self.scheduler is not None and progress.scheduler:
            self.scheduler.load_state_dict(progress.scheduler)
        if self.scheduler is None:  # the config's lr is the truth (world size or lr may have changed)
            for group in self.optimizer.param_groups:
                group["lr"] = self.config.lr * self.lr_factor
        self.epoch, self.batches_done, self.global_step = progress.epoch, progress.batches_done, progress.global_step
        if progress.rng is None:  # another data order: fresh streams, the epoch's sums start over
            seed_everything(self.config.seed + self.topo.rank + 1000 * self.epoch)
        else:
            set_rng_state(progress.rng)
            self._sums = torch.tensor(progress.sums, dtype=torch.float64, device=self.device)
        return True
