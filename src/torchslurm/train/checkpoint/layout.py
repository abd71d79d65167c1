"""Where a checkpoint's files live and when a checkpoint counts: the folder protocol, torch-free.

    <run_dir>/checkpoints/ = <root>
    <root>/step-000000123/     a checkpoint; it counts once COMPLETE exists (and its checksums match)
      COMPLETE                 JSON: step, format and the checksum of every file (checkpoint.integrity)
      state.pt                 rank 0: position, scaler, scheduler, config, the optimizer's settings
      rank-00000.pt            each rank's RNG states and metric sums
      tensors.pt               DDP or one process: model and optimizer tensors, one torch.save by rank 0
      shards/                  FSDP: the same tensors, each rank its parts in tensors-<rank>.pt (earlier
                               releases: torch.distributed.checkpoint's .metadata and *.distcp files)
    <root>/.staging-<step>-<attempt>/   a checkpoint being written; renamed to step-N when complete
    <root>/.trash-*                     old checkpoints being deleted
    <root>/.torchslurm-run.lock         the run that owns the folder (checkpoint.lock)

A format-1 checkpoint (the first release) is one state.pt with the whole model and a COMPLETE that
records its sha256. This module is the only place these names are spelled.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
from pathlib import Path

from torchslurm.errors import CheckpointError

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
"""The folder of a run_dir that holds its checkpoints."""
FORMAT = 2
"""The format the Trainer writes: 2 (tensors.pt or shards/, rank files, state.pt)."""
STATE_FILE = "state.pt"
MARKER = "COMPLETE"
TENSORS_FILE = "tensors.pt"
SHARDS = "shards"
SHARD_FILES = "tensors-*.pt"
"""The files of shards/, one per rank (`shard_file`)."""
LOCK = ".torchslurm-run.lock"
_STEP_DIR = re.compile(r"step-([0-9]+)")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:09d}"


def staging_dir(root: Path, step: int, attempt: str) -> Path:
    """Where the save of `step` by `attempt` (one run's saves, see writer.agree_attempt) is written."""
    return Path(root) / f".staging-{step:09d}-{attempt}"


def own_folder(path: Path) -> None:
    """The folder `path` made (with those above it; every rank of a save may make it at once), refusing
    a link planted in its place: a checkpoint's files go into its own folders, not where a link points.
    (The checkpoints folder itself may be a link, e.g. to a faster file system.)"""
    path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        raise CheckpointError(f"{path} is a symbolic link; a checkpoint is written into folders of its own.",
                              "remove the link; if you did not make it, another user can write to "
                              f"{path.parent}: use a run_dir only you can write to.")


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def shard_file(rank: int) -> str:
    """Rank `rank`'s parts of FSDP's sharded tensors, relative to the checkpoint's folder."""
    return f"{SHARDS}/{SHARD_FILES.replace('*', f'{rank:05d}')}"


def folder_of(path: Path) -> Path:
    """The step-N folder of `path` (the folder itself, or its state.pt)."""
    path = Path(path)
    return path.parent if path.name == STATE_FILE else path


def fsync(path: Path) -> None:
    """Flush a file (or a folder's entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Pruner:
    """Deletes old checkpoints without stalling training: each is renamed to `.trash-*` at once (gone
    for every reader), and its files are deleted by a thread, since deleting a large checkpoint takes
    as long as writing one. A trash folder left by an exit mid-delete goes with the next save's
    leftovers; `wait()` returns once every deletion started here is done.

    It never deletes the newest checkpoint known to verify: the one this run resumed from, or one it
    wrote that is on disk (`verified`). A COMPLETE marker alone does not say that: a newer checkpoint
    whose files are corrupt (skipped by resume=auto) would otherwise count among the newest
    `keep_last` and leave nothing that loads."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._verified: set[str] = set()  # the names of step-N folders

    def verified(self, path: Path) -> None:
        """`path` (a step-N folder) verifies and is on disk."""
        self._verified.add(Path(path).name)

    def unverified(self, path: Path) -> None:
        """`path` is being replaced by files not yet known to be on disk."""
        self._verified.discard(Path(path).name)

    def prune(self, root: Path, keep_last: int) -> list[Path]:
        """Delete complete checkpoints older than the newest `keep_last` (at least 1: TrainConfig), except
        the newest verified one; return what was deleted."""
        found = complete(root)
        doomed = [path for _, path in found[:-keep_last]]
        good = [path for _, path in found if path.name in self._verified]
        doomed = [path for path in doomed if not good or path != good[-1]]
        trash = []
        for path in doomed:
            trash.append(root / f".trash-{path.name}-{os.getpid()}-{threading.get_ident()}")
            os.replace(path, trash[-1])
            self.unverified(path)
        if trash:
            thread = threading.Thread(target=_delete, args=(trash,), name="torchslurm-prune", daemon=True)
            self._threads.append(thread)
            thread.start()
        return doomed

    def wait(self) -> None:
        while self._threads:
            self._threads.pop().join()


def _delete(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def publish(staging: Path, final: Path, keep_last: int, pruner: Pruner, durable: bool = True) -> None:
    """Make a staged checkpoint folder (its files fsynced) the checkpoint `final`: fsync its marker
    and itself, rename, fsync the parent, then delete all but the newest `keep_last` complete ones.
    `durable=False`: no fsync here, the caller makes it durable later (durability.Durability)."""
    root = final.parent
    pruner.unverified(final)
    if durable:
        fsync(staging / MARKER)
        fsync(staging)
    if final.exists():  # the same step saved again (e.g. after a resume): swap the old one out
        trash = root / f".trash-{final.name}-{os.getpid()}"
        os.replace(final, trash)
        os.replace(staging, final)
        shutil.rmtree(trash)
    else:
        os.replace(staging, final)  # rename(2): atomic within one filesystem
    if durable:
        fsync(root)
        pruner.verified(final)
    pruner.prune(root, keep_last)
    logger.debug("checkpoint saved: %s", final)


def remove_leftovers(root: Path, keep: str | None = None) -> None:
    """Staging folders of writers that died mid-save (kill -9, node loss): never complete, never
    read. Those whose names end in `keep` belong to saves in progress and stay."""
    found = [*root.glob(".staging-*"), *root.glob(".trash-*")]  # none where root is no folder
    for leftover in [path for path in found if keep is None or not path.name.endswith(keep)]:
        logger.debug("removing %s, left by an interrupted save", leftover)
        shutil.rmtree(leftover, ignore_errors=True)


def complete(root: Path) -> list[tuple[int, Path]]:
    """Checkpoints under `root` that have a completion marker, oldest first."""
    if not Path(root).is_dir():
        return []
    found = []
    for child in Path(root).iterdir():
        match = _STEP_DIR.fullmatch(child.name)
        if match and (child / MARKER).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)
