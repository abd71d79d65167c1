"""Writing a checkpoint (format 2, the same for DDP and FSDP; its files: checkpoint.layout): every
rank writes its own files and no rank gathers the model. COMPLETE is written last, by rank 0, once
every rank said its files are written, with the checksum of each (checkpoint.integrity).

The folder is written as `.staging-<step>-<attempt>` and renamed (layout.publish). Replicated
tensors are one torch.save by rank 0 (tensors.pt); sharded ones one torch.save by each rank of its
parts (checkpoint.shards). Neither goes through torch.distributed.checkpoint, whose planning and
per-tensor writes cost a small model's save 1.5 ms more than the bytes do (7× torch.save) and a
sharded GPT's 1.5-2.8× a bare torch.save of the same bytes.

A save on the training thread costs what writing the bytes into the page cache costs: files are
checksummed beside the write and fsynced afterwards on a thread (Durability), while the previous
checkpoint is kept until they are. Asynchronous saves stage the tensors to CPU memory at the step
boundary, then a thread writes them, fsyncs them and finishes the checkpoint over a Gloo group of
its own, so the training loop's collectives never meet the writer's.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from torchslurm.runtime.safefiles import open_write
from torchslurm.train.checkpoint import hashed, shards
from torchslurm.train.checkpoint.copying import Ready, copying_after
from torchslurm.train.checkpoint.durability import Durability, disk_failure, save_failed
from torchslurm.train.checkpoint.layout import (
    FORMAT,
    MARKER,
    SHARDS,
    STATE_FILE,
    TENSORS_FILE,
    Pruner,
    fsync,
    own_folder,
    publish,
    rank_file,
    remove_leftovers,
    shard_file,
    staging_dir,
    step_dir,
)
from torchslurm.train.checkpoint.state import distributed, stage
from torchslurm.train.checkpoint.writeback import Writeback


@dataclass
class Snapshot:
    """One rank's part of a checkpoint, taken at an optimizer-step boundary."""

    root: Path
    step: int
    tensors: dict[str, Any]
    rank_state: dict[str, Any]
    trainer_state: dict[str, Any] | None
    """Rank 0's state.pt; None on the other ranks."""
    keep_last: int
    publish_after: threading.Event | None = None
    """Rank 0 publishes the checkpoint only once this is set (the epoch's metrics are logged first:
    a checkpoint never leads its own epoch's record)."""
    ready: Ready | None = None
    """Live GPU tensors written beside other work: copied to the host after this, off its stream."""


def write(snap: Snapshot, group: dist.ProcessGroup | None = None, later: Durability | None = None,
          attempt: str | None = None, pruner: Pruner | None = None, writeback: bool = False) -> Path:
    """Write `snap` on every rank of `group` and publish the checkpoint once all agree; returns its folder
    (published on return on rank 0; on the others once rank 0 is done, which the next save or
    `Writer.finish` waits for).

    All ranks call it. Each writes its files into `.staging-<step>-<attempt>` (`attempt` names this
    run's saves, the same on every rank: see `agree_attempt`) and reports their checksums; rank 0
    clears what interrupted saves of other attempts left, writes COMPLETE with every checksum and
    renames the folder. Replicated tensors (DDP, one process) are written by rank 0 alone, in one
    file; sharded ones (FSDP's DTensors) by every rank its own parts, in one file. One all_gather of
    the checksums is then the only collective of a save.

    Without `later` every file is fsynced before COMPLETE is written, and all but `keep_last`
    checkpoints are deleted. With `later` (a save that holds up training) nothing is fsynced here:
    `later` does it once started, and the caller joins it before its next save. Each rank joins its
    own before it sends its checksums, so by the time rank 0 prunes, the checkpoint before this one
    is on disk everywhere: it keeps that one and `keep_last` in all, not counting this one. Such a
    save also leaves out torch.save's redundant crc32s. With `writeback` large files go to disk while
    they are written (checkpoint.writeback): the fsync after waits for less (0-0.8 s instead of 3.1-3.6
    for 1.8 GiB on a 2-core VM), but the writing takes longer (2.8-3.5 s instead of 1.4-1.8), so only
    a save whose fsync is waited for next asks for it."""
    rank = dist.get_rank() if distributed() else 0
    attempt = agree_attempt(group) if attempt is None else attempt
    final = step_dir(snap.root, snap.step)
    staging = staging_dir(snap.root, snap.step, attempt)
    if rank == 0:
        remove_leftovers(snap.root, keep=f"-{attempt}")
    sharded = _sharded(snap.tensors)
    for made in (staging, staging / SHARDS) if sharded else (staging,):
        own_folder(made)
    with ThreadPoolExecutor(1, thread_name_prefix="torchslurm-checksum") as pool, \
            nullcontext() if later is None else hashed.without_record_crc32():
        early = Writeback() if writeback else None
        mine = _write_files(snap, staging, rank, pool, sync=later is None, sharded=sharded, writeback=early)
    if later is not None:
        later.writeback = early
        for name in mine:
            later.hold(staging / name)
    everyone: list[Any] = [mine]
    if distributed():
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, mine, group=group)
    if rank == 0:
        if snap.publish_after is not None:
            snap.publish_after.wait()
        files = {name: digest for part in everyone for name, digest in part.items()}
        marker = {"step": snap.step, "format": FORMAT, "files": dict(sorted(files.items()))}
        with open_write(staging / MARKER) as out:
            out.write(json.dumps(marker) + "\n")
        folders = [SHARDS] if sharded else []
        if later is None:
            for folder in folders:
                fsync(staging / folder)
            publish(staging, final, snap.keep_last, pruner or Pruner())
        else:
            publish(staging, final, snap.keep_last + 1, pruner or Pruner(), durable=False)
            later.after_rename(final / MARKER, *(final / folder for folder in folders), final, snap.root)
    if later is not None:
        later.start()
    return final


def agree_attempt(group: dist.ProcessGroup | None = None) -> str:
    """A name for this run's saves, the same on every rank (rank 0's process id and start time):
    staging folders of other attempts are leftovers, this one's never are (a collective)."""
    mine = [f"{os.getpid():x}{time.time_ns() // 1_000_000:x}"]
    if distributed():
        dist.broadcast_object_list(mine, src=0, group=group)
    return str(mine[0])


def _sharded(tensors: Mapping[str, Any]) -> bool:
    return any(isinstance(value, DTensor) for value in tensors.values())


def _write_files(snap: Snapshot, staging: Path, rank: int, pool: ThreadPoolExecutor, sync: bool,
                 sharded: bool, writeback: Writeback | None) -> dict[str, str]:
    """This rank's files of the checkpoint, each checksummed while written and, if `sync`, fsynced;
    -> file (relative to `staging`) -> checksum."""
    mine = {}
    own = {rank_file(rank): snap.rank_state}
    with copying_after(snap.ready):
        if sharded:
            own[shard_file(rank)] = shards.parts(snap.tensors, rank)
        elif rank == 0:  # on the CPU (no copy there), so that it loads anywhere, memory-mapped
            own[TENSORS_FILE] = {key: value.detach().cpu() for key, value in snap.tensors.items()}
    if snap.trainer_state is not None:
        own[STATE_FILE] = snap.trainer_state
    for name, state in own.items():
        mine[name] = hashed.save(state, staging / name, pool, writeback.request if writeback else None)
        if sync:
            if writeback is not None:
                writeback.join()
            fsync(staging / name)
    return mine


def _barrier(group: dist.ProcessGroup | None) -> None:
    if distributed():
        dist.barrier(group=group)


class Writer:
    """Every checkpoint of a run: written now, on the training thread, or in the background, at most
    one at a time.

    `save(snap)` writes it now and leaves only the fsyncs to a thread (`Durability`);
    `stage()` copies tensors for a background save and `start(snap)` begins one, on a Gloo group of
    its own, durable before it is published (or, `defer_fsync`, fsynced afterwards as `save` does).
    `wait_written()` returns once a background save is published, `wait()` once the last save is
    also on disk; both re-raise a background error on the training thread. `finish()` is the end of
    a run on every rank: wait, then the older checkpoints beyond keep_last go; `close()` waits for
    their deletion."""

    def __init__(self) -> None:
        self._group: dist.ProcessGroup | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._durability: Durability | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        self._attempt: str | None = None
        self._pruner = Pruner()
        self.last: Path | None = None

    def save(self, snap: Snapshot, last: bool = False) -> Path:
        """`last`: the run waits for this save to be on disk next, so its pages go to disk while it is
        written (checkpoint.writeback); otherwise the Durability thread writes them after training went on."""
        self.wait()
        self._durability = Durability(snap.step)
        try:
            self.last = write(snap, later=self._durability, attempt=self.attempt(), pruner=self._pruner,
                              writeback=last)
        except Exception as exc:
            self._durability = None
            if not disk_failure(exc):
                raise  # a peer gone mid-save (a failed collective): the watchdog's to diagnose
            raise save_failed(snap.step, exc) from exc
        return self.last

    def attempt(self) -> str:
        if self._attempt is None:
            self._attempt = agree_attempt()  # a collective, once: every rank's first save or open()
        return self._attempt

    def stage(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`stage(tensors)`, copying CPU tensors into buffers kept from save to save: a fresh copy
        faults all of its memory in every time (30-800 ms for 292 MiB on a loaded 2-core machine),
        a kept one costs a memcpy. Waits for the save in flight first: it still reads them. The
        price is one more copy of this rank's state held for the whole run."""
        self.wait()
        on_cpu = {k: v for k, v in tensors.items() if v.device.type == "cpu"}
        staged = stage({k: v for k, v in tensors.items() if k not in on_cpu})  # GPU: a copy to the host
        for key, value in on_cpu.items():
            staged[key] = self._copy(key, value.detach())
        return {key: staged[key] for key in tensors}

    def _copy(self, key: str, value: torch.Tensor) -> torch.Tensor:
        local = value.to_local() if isinstance(value, DTensor) else value
        kept = self._buffers.get(key)
        if kept is None or kept.shape != local.shape or kept.dtype != local.dtype:
            kept = self._buffers[key] = torch.empty_like(local, memory_format=torch.contiguous_format)
        kept.copy_(local)
        if isinstance(value, DTensor):
            return DTensor.from_local(kept, value.device_mesh, value.placements, run_check=False,
                                      shape=value.shape, stride=value.stride())
        return kept

    def open(self) -> None:
        """What saves need, made now rather than in the first save (collectives: every rank calls
        it, and they cost a few ms): the attempt's name and the background saves' Gloo group."""
        self.attempt()
        if self._group is None and distributed():
            self._group = dist.new_group(backend="gloo")
            dist.barrier(group=self._group)  # its connections made now, not in the first save

    def start(self, snap: Snapshot, defer_fsync: bool = False, last: bool = False) -> None:
        """Write `snap` in the background: staged tensors, or live ones that nothing changes until
        `wait_written()` returns (the Trainer's epoch-end save beside validation, which also defers
        its fsyncs as `save` does, `last` too); otherwise it is on disk before it is published, its
        pages sent to disk while it is written."""
        self.wait()
        self.open()
        self._durability = Durability(snap.step) if defer_fsync else None
        self._thread = threading.Thread(target=self._run, args=(snap, self._durability, last or not defer_fsync),
                                        name="torchslurm-checkpoint", daemon=True)
        self._thread.start()

    def _run(self, snap: Snapshot, later: Durability | None, writeback: bool) -> None:
        try:
            self.last = write(snap, self._group, later=later, attempt=self._attempt, pruner=self._pruner,
                              writeback=writeback)
        except BaseException as exc:  # reported on the training thread by wait()
            self._error = exc
            if isinstance(exc, Exception) and disk_failure(exc):
                self._error = save_failed(snap.step, exc)
                self._error.__cause__ = exc

    def wait(self) -> Path | None:
        """Until the last save is published and on disk."""
        self.wait_written()
        if self._durability is not None:
            durability, self._durability = self._durability, None
            durability.join()
            if self.last is not None:
                self._pruner.verified(self.last)
        return self.last

    def verified(self, path: Path) -> None:
        """`path` (a checkpoint of this writer's folder) verified, e.g. the one resumed from: pruning
        keeps the newest such (layout.Pruner)."""
        self._pruner.verified(path)

    def wait_written(self) -> Path | None:
        """Until a background save is published (its fsyncs may still run)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self.last

    def finish(self, root: Path, keep_last: int) -> None:
        """The end of a run, on every rank: the last checkpoint on disk everywhere, then rank 0
        deletes what `save` had to keep beyond `keep_last` while it was not."""
        self.wait()
        _barrier(None)
        if not distributed() or dist.get_rank() == 0:
            self._pruner.prune(root, keep_last)

    def close(self) -> None:
        """The last save on disk and every old checkpoint this writer pruned deleted."""
        try:
            self.wait()
        finally:
            self._pruner.wait()
