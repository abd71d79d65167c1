"""The Trainer's checkpoints: saving at a step boundary, choosing the checkpoint to resume from (all
ranks agree), and restoring model, optimizer, position in the epoch and RNG states from it.

Functions of a Trainer, which calls them as its methods `save()` and `_resume()`.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from torchslurm.errors import CheckpointError
from torchslurm.train import checkpoint, dcp
from torchslurm.train.checkpoint import rng_state, seed_everything, set_rng_state

if TYPE_CHECKING:
    from torchslurm.train.trainer import Trainer

logger = logging.getLogger("torchslurm.train.trainer")  # the Trainer's own messages, as before


OVERLAP_MIN_BYTES = 32 << 20
"""An epoch-end save of at least this much state (this rank's tensors) is written beside validation;
a smaller one first, on the training thread: its cost is Python (planning, pickling) that would only
take turns with validation for the interpreter lock, not I/O that overlaps."""


def save(trainer: Trainer, beside: threading.Event | None = None) -> Path | None:
    """Trainer.save(): every rank writes its own files (train.dcp), now or, with checkpoint_async,
    from a CPU copy in the background; the folder on rank 0, None on the others.

    `beside` (the epoch end): the training thread goes on with something that changes neither model
    nor optimizer (validation) and sets `beside` when it is done, then waits with
    `Writer.wait_written()`. A large state is written meanwhile from the live tensors, published by
    rank 0 once `beside` is set; a small one is written now. The caller announces it."""
    trainer._saved_step = trainer.global_step
    tensors, plain = dcp.split_state(trainer.model, trainer.optimizer)
    state = None
    if trainer.is_main:
        state = {
            "format": dcp.FORMAT, "optim_plain": plain, "scaler": trainer.scaler.state_dict(),
            "scheduler": trainer.scheduler.state_dict() if trainer.scheduler else {},
            "epoch": trainer.epoch, "batches_done": trainer.batches_done, "global_step": trainer.global_step,
            "world_size": trainer.topo.world_size, "config": trainer.config.to_dict(),
        }
    overlap = beside is not None and dcp.local_bytes(tensors) >= OVERLAP_MIN_BYTES
    snap = dcp.Snapshot(trainer.checkpoint_dir, trainer.global_step, tensors,
                        {"rng": rng_state(), "sums": trainer._sums.tolist()}, state, trainer.config.keep_last,
                        publish_after=beside if overlap else None)
    background = trainer.config.checkpoint_async
    if background:
        snap.tensors = trainer._writer.stage(tensors)
        trainer._writer.start(snap)
    elif overlap:
        trainer._writer.start(snap, defer_fsync=True)
    else:
        trainer._writer.save(snap)
    path = checkpoint.step_dir(trainer.checkpoint_dir, trainer.global_step)
    if beside is None:
        announce(trainer, path, ", writing in the background" if background else "")
    return path if trainer.is_main else None


def announce(trainer: Trainer, path: Path | None, note: str = "") -> None:
    """Rank 0's line about the checkpoint just taken (`path`: save()'s answer, None on other ranks)."""
    where = f"epoch {trainer.epoch + 1}, batch {trainer.batches_done}" if trainer.batches_done \
        else f"after epoch {trainer.epoch}"
    if path is not None:
        trainer._last_checkpoint = path
        logger.info("checkpoint %s (%s, step %d)%s", path, where, trainer.global_step, note)


def choose(trainer: Trainer) -> Path | None:
    """Rank 0 picks (skipping corrupt ones with a warning) and tells the others, so all agree."""
    wanted = trainer.config.resume
    choice: list[str | None] = [None]
    if trainer.is_main and wanted != "never":
        if wanted == "auto":
            found = checkpoint.load_latest(trainer.checkpoint_dir)
            choice[0] = str(found[0]) if found else None
        else:
            checkpoint.load(Path(wanted))  # fail early, with the reason, on rank 0
            choice[0] = wanted
    if trainer.topo.world_size > 1:
        dist.broadcast_object_list(choice, src=0)
    return Path(choice[0]) if choice[0] else None


def resume(trainer: Trainer) -> bool:
    """Load model, optimizer, position and RNG states; False when starting fresh."""
    path = choose(trainer)
    if path is None:
        if trainer.is_main:
            trainer.log.keep_until(0)
        return False
    try:  # on the CPU: RNG states must stay CPU tensors. Rank 0 verified every checksum already
        state = checkpoint.load(path, verify=trainer.is_main)
        if state.get("format", 1) >= dcp.FORMAT:
            dcp.load_into(checkpoint.folder_of(path), state, trainer.model, trainer.optimizer)
        else:
            dcp.load_single_file(state, trainer.model, trainer.optimizer)
    except (CheckpointError, OSError) as exc:
        reason = exc.message if isinstance(exc, CheckpointError) else str(exc)
        raise CheckpointError(f"rank {trainer.topo.rank} cannot read {path}: {reason}",
                              "run_dir must be on a filesystem every node sees (e.g. your home or project "
                              "dir).") from exc
    trainer.scaler.load_state_dict(state["scaler"])
    if trainer.scheduler is not None and state["scheduler"]:
        trainer.scheduler.load_state_dict(state["scheduler"])
    if trainer.scheduler is None:  # the config's lr is the truth (world size or lr may have changed)
        for group in trainer.optimizer.param_groups:
            group["lr"] = trainer.config.lr * trainer.lr_factor
    trainer.epoch, trainer.batches_done = state["epoch"], state["batches_done"]
    trainer.global_step = state["global_step"]
    changed = checkpoint.layout_changes(state, {
        "world_size": trainer.topo.world_size, "batch_size": trainer.config.batch_size, "seed": trainer.config.seed,
        "grad_accum_steps": trainer.config.grad_accum_steps})
    if not changed:
        mine = state["ranks"][trainer.topo.rank] if "ranks" in state else checkpoint.load_plain(
            checkpoint.folder_of(path) / dcp.rank_file(trainer.topo.rank))
        set_rng_state(mine["rng"])
        trainer._sums = torch.tensor(mine["sums"], dtype=torch.float64, device=trainer.device)
    else:
        logger.warning("checkpoint %s: %s, so data order and RNG streams differ from an uninterrupted run%s",
                       path, changed, "; restarting the interrupted epoch" if trainer.batches_done else "")
        trainer.batches_done = 0
        seed_everything(trainer.config.seed + trainer.topo.rank + 1000 * trainer.epoch)
    if trainer.is_main:
        trainer.log.keep_until(trainer.global_step)
        logger.info("Resuming from %s: epoch %d, batch %d, step %d", path, trainer.epoch + 1, trainer.batches_done,
                    trainer.global_step)
    return True
