"""The Trainer's checkpoints: saving a run's progress at a step boundary, choosing the checkpoint to
resume from (all ranks agree), and giving model, optimizer and progress back from it.

The Trainer hands its position over as a value (`TrainProgress`) and gets one back from `restore()`;
the checkpointer holds the model and optimizer it checkpoints and nothing of the Trainer's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torchslurm.errors import CheckpointError
from torchslurm.train.checkpoint import lock
from torchslurm.train.checkpoint.copying import device_ready
from torchslurm.train.checkpoint.layout import FORMAT, folder_of, rank_file, step_dir
from torchslurm.train.checkpoint.reading import load, load_latest, load_plain
from torchslurm.train.checkpoint.state import load_into, load_single_file, local_bytes, split_state
from torchslurm.train.checkpoint.writer import Snapshot, Writer

logger = logging.getLogger("torchslurm.train.trainer")  # the lines a run's log has always shown

OVERLAP_MIN_BYTES = 32 << 20
"""An epoch-end save of at least this much state (this rank's tensors) is written beside validation;
a smaller one first, on the training thread: its cost is Python (planning, pickling) that would only
take turns with validation for the interpreter lock, not I/O that overlaps."""


@dataclass(frozen=True)
class TrainProgress:
    """Where a run stands at an optimizer-step boundary: everything a checkpoint restores besides the
    model and optimizer."""

    epoch: int
    """Epochs finished."""
    batches_done: int
    """Batches of the current epoch already trained (0 at an epoch's end)."""
    global_step: int
    """Optimizer steps taken."""
    sums: list[float] | None = None
    """This rank's metric sums of the current epoch; None after a restore whose data order changed."""
    rng: dict[str, Any] | None = None
    """This rank's random streams (train.rng); None after a restore whose data order changed: the
    caller seeds them afresh."""
    scaler: dict[str, Any] = field(default_factory=dict)
    """The GradScaler's state (amp=fp16)."""
    scheduler: dict[str, Any] = field(default_factory=dict)
    """The lr scheduler's state; empty without one."""

    def where(self) -> str:
        """'epoch 2, batch 7' mid-epoch, 'after epoch 1' at an epoch's end."""
        return f"epoch {self.epoch + 1}, batch {self.batches_done}" if self.batches_done \
            else f"after epoch {self.epoch}"


class Checkpointer:
    """Checkpoints of `model` and `optimizer` in `root` (every rank builds one and calls each method).

    `config` (plain values) is stored with every checkpoint; `order` names what fixes the order of the
    data (world size, batch size, seed, ...): a checkpoint saved under other values resumes at the start
    of its interrupted epoch with fresh random streams. `background`: write in the background from a
    CPU copy. `overlap_min_bytes`: the smallest state an epoch-end save writes beside validation.
    `environ`: the job's variables; the lock that makes `root` this run's names its Slurm job (a
    requeued job takes its own lock back)."""

    def __init__(self, root: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, rank: int,
                 world_size: int, keep_last: int, config: Mapping[str, Any], order: Mapping[str, Any],
                 background: bool = False, overlap_min_bytes: int = OVERLAP_MIN_BYTES,
                 environ: Mapping[str, str] | None = None) -> None:
        self.root, self.model, self.optimizer = Path(root), model, optimizer
        self.rank, self.world_size, self.keep_last = rank, world_size, keep_last
        self.config, self.order = dict(config), dict(order)
        self.background, self.overlap_min_bytes = background, overlap_min_bytes
        self.last: Path | None = None
        """The last checkpoint saved (rank 0; None on the others)."""
        self.saved_step = -1
        """The global step of the last save of this run."""
        self.written: list[str] = []
        """How each save of this run was written: 'now', 'beside' (validation) or 'background'."""
        self._writer = Writer()
        self._environ = dict(environ or {})
        self._lock: lock.Lock | None = None
        self._owned = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ---- saving ---------------------------------------------------------------------------------
    def open(self) -> None:
        """What saves need, made before the first step (collectives: every rank calls it): the
        folder's lock first, then the writer's group."""
        self.own()
        self._writer.open()

    def own(self) -> None:
        """Make `root` this run's (once; every rank calls it): rank 0 takes its lock (checkpoint.lock)
        and tells the others, so that a run_dir another run holds is every rank's error."""
        if self._owned:
            return
        refusal: list[tuple[str, str | None] | None] = [None]
        if self.is_main:
            try:
                self._lock = lock.acquire(self.root, lock.me(self._environ))
            except CheckpointError as exc:
                refusal[0] = (exc.message, exc.hint)
        if self.world_size > 1:
            dist.broadcast_object_list(refusal, src=0)
        if refusal[0] is not None:
            raise CheckpointError(*refusal[0])
        self._owned = True

    def save(self, progress: TrainProgress, last: bool = False) -> Path | None:
        """Checkpoint `progress` now, or with `background`, from a CPU copy in the background; the
        folder on rank 0 (complete once `wait()` returns), None on the others. `last`: the run waits
        for it to be on disk next, so its pages go to disk while it is written (checkpoint.writeback)."""
        path = self._save(progress, beside=None, last=last)
        self._announce(progress, path)
        return path

    @contextmanager
    def beside(self, progress: TrainProgress, last: bool = False) -> Iterator[None]:
        """An epoch end's save, written while the body runs something that changes neither model nor
        optimizer (validation): a large state from the live tensors meanwhile, published by rank 0
        once the body is done (the epoch's record comes first); a small one first. `last` as in save."""
        done = threading.Event()
        path = self._save(progress, beside=done, last=last)
        try:
            yield
        finally:
            done.set()
        if not self.background:
            self._writer.wait_written()
        self._announce(progress, path)

    def _save(self, progress: TrainProgress, beside: threading.Event | None, last: bool) -> Path | None:
        self.own()
        self.saved_step = progress.global_step
        tensors, plain = split_state(self.model, self.optimizer)
        overlap = beside is not None and local_bytes(tensors) >= self.overlap_min_bytes
        snap = Snapshot(self.root, progress.global_step, tensors, {"rng": progress.rng, "sums": progress.sums},
                        self._main_state(progress, plain), self.keep_last, publish_after=beside if overlap else None,
                        ready=device_ready(tensors) if overlap else None)
        if self.background:
            snap.tensors = self._writer.stage(tensors)
            self._writer.start(snap)
        elif overlap:
            self._writer.start(snap, defer_fsync=True, last=last)
        else:
            self._writer.save(snap, last=last)
        self.written.append("background" if self.background else "beside" if overlap else "now")
        return step_dir(self.root, progress.global_step) if self.is_main else None

    def _main_state(self, progress: TrainProgress, plain: dict[str, Any]) -> dict[str, Any] | None:
        """Rank 0's state.pt."""
        if not self.is_main:
            return None
        return {"format": FORMAT, "optim_plain": plain, "scaler": progress.scaler, "scheduler": progress.scheduler,
                "epoch": progress.epoch, "batches_done": progress.batches_done,
                "global_step": progress.global_step, "world_size": self.world_size, "config": self.config}

    def _announce(self, progress: TrainProgress, path: Path | None) -> None:
        if path is not None:
            self.last = path
            note = ", writing in the background" if self.background else ""
            logger.info("checkpoint %s (%s, step %d)%s", path, progress.where(), progress.global_step, note)

    def wait(self) -> None:
        """Return once the last save is complete and on disk; raise a background save's error."""
        self._writer.wait()

    def finish(self) -> None:
        """The end of a run on every rank: the last checkpoint on disk everywhere, then only the newest
        keep_last kept."""
        self._writer.finish(self.root, self.keep_last)

    def close(self) -> None:
        """Whatever happened: a save in flight completed (a requeued job finds it whole), old checkpoints
        deleted, the folder's lock released."""
        try:
            self._writer.close()
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            self._owned = False

    # ---- resuming -------------------------------------------------------------------------------
    def choose(self, resume: str) -> Path | None:
        """The checkpoint `resume` (auto | never | a folder) names: rank 0 picks (skipping corrupt ones
        with a warning) and tells the others, so all agree."""
        choice: list[str | None] = [None]
        if self.is_main and resume != "never":
            if resume == "auto":
                found = load_latest(self.root)
                choice[0] = str(found[0]) if found else None
            else:
                load(Path(resume))  # fail early, with the reason, on rank 0
                choice[0] = resume
        if self.world_size > 1:
            dist.broadcast_object_list(choice, src=0)
        return Path(choice[0]) if choice[0] else None

    def restore(self, resume: str) -> TrainProgress | None:
        """Model and optimizer loaded from the checkpoint `resume` names, and its progress; None when
        there is none (a fresh start)."""
        path = self.choose(resume)
        if path is None:
            return None
        state = self._load(path)
        if folder_of(path).parent.resolve() == self.root.resolve():
            self._writer.verified(folder_of(path))  # never pruned before a newer one is on disk
        progress = TrainProgress(state["epoch"], state["batches_done"], state["global_step"],
                                 scaler=state["scaler"], scheduler=state["scheduler"])
        changed = layout_changes(state, self.order)
        if changed:
            logger.warning("checkpoint %s: %s, so data order and RNG streams differ from an uninterrupted run%s",
                           path, changed, "; restarting the interrupted epoch" if progress.batches_done else "")
            progress = replace(progress, batches_done=0)  # no sums, no streams: the caller starts them afresh
        else:
            mine = state["ranks"][self.rank] if "ranks" in state else load_plain(
                folder_of(path) / rank_file(self.rank))
            progress = replace(progress, sums=list(mine["sums"]), rng=mine["rng"])
        if self.is_main:
            logger.info("Resuming from %s: epoch %d, batch %d, step %d", path, progress.epoch + 1,
                        progress.batches_done, progress.global_step)
        return progress

    def _load(self, path: Path) -> dict[str, Any]:
        """state.pt of `path`, with model and optimizer loaded (on the CPU: RNG states must stay CPU
        tensors). Rank 0 verified every checksum already, while choosing. A file this rank cannot read
        points at the file system; a checkpoint of another model keeps its own message and hint (raised
        without the chain: every rank says the same)."""
        try:
            state = load(path, verify=self.is_main)
        except (CheckpointError, OSError) as exc:
            raise self._unreadable(path, exc) from exc
        try:
            if state.get("format", 1) >= FORMAT:
                load_into(folder_of(path), state, self.model, self.optimizer)
            else:
                load_single_file(state, self.model, self.optimizer)
        except OSError as exc:
            raise self._unreadable(path, exc) from exc
        except CheckpointError as exc:
            if not self.is_main and not Path(path).exists():  # rank 0 chose it: run_dir is not shared here
                raise self._unreadable(path, exc) from None
            raise CheckpointError(f"rank {self.rank}: {exc.message}", exc.hint) from None
        return state

    def _unreadable(self, path: Path, exc: CheckpointError | OSError) -> CheckpointError:
        reason = exc.message if isinstance(exc, CheckpointError) else str(exc)
        return CheckpointError(f"rank {self.rank} cannot read {path}: {reason}",
                               "run_dir must be on a filesystem every node sees (e.g. your home or project dir).")


def layout_changes(state: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """What differs between a checkpoint's run and `now` (world_size and config keys) that makes
    its position in the epoch meaningless; '' when nothing does."""
    saved = {"world_size": state["world_size"], **state["config"]}
    return ", ".join(f"{key} was {saved.get(key, 'unset')}, now {value}" for key, value in now.items()
                     if saved.get(key) != value)
