"""Checkpoints that readers see whole or not at all.

Layout: `<root>/step-000000123/state.pt` plus `COMPLETE` (JSON: step, and the checksum of every file:
`files`, see train.checksum; a single-file checkpoint of format 1 has `sha256` of state.pt). Checkpoints of format 2
(train.dcp) add the tensors (`tensors.pt`, or `shards/` by torch.distributed.checkpoint) and one
`rank-NNNNN.pt` per rank. A
checkpoint is written into a staging directory, fsynced, renamed into place (atomic within one
filesystem), and only counts once its `COMPLETE` marker exists and its checksum matches.
Loading uses `torch.load(weights_only=True)`: a checkpoint never unpickles arbitrary objects, so
state is stored as tensors and plain Python types.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from torchslurm.errors import CheckpointError
from torchslurm.train import checksum

logger = logging.getLogger(__name__)

STATE_FILE = "state.pt"
MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:09d}"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync(path: Path) -> None:
    """Flush a file (or a folder's entries) to disk."""
    _fsync(path)


def save(root: Path, step: int, state: Mapping[str, Any], keep_last: int = 2) -> Path:
    """Write `state` as `<root>/step-N` atomically in format 1 (one file, written by rank 0; the
    Trainer writes format 2, train.dcp), then delete all but the newest `keep_last` complete
    checkpoints. Call it on one rank only (rank 0)."""
    root = Path(root)
    final, staging = step_dir(root, step), root / f".staging-{step:09d}-{os.getpid()}"
    remove_leftovers(root)
    staging.mkdir(parents=True)
    torch.save(dict(state), staging / STATE_FILE)
    _fsync(staging / STATE_FILE)
    marker = {"step": step, "sha256": checksum.of_file(staging / STATE_FILE, hashlib.sha256())}
    (staging / MARKER).write_text(json.dumps(marker) + "\n")
    publish(staging, final, keep_last)
    return final


def publish(staging: Path, final: Path, keep_last: int, durable: bool = True) -> None:
    """Make a staged checkpoint folder (its files fsynced) the checkpoint `final`: fsync its marker
    and itself, rename, fsync the parent, then delete all but the newest `keep_last` complete ones.
    `durable=False`: no fsync here, the caller makes it durable later (train.dcp.Durability)."""
    root = final.parent
    if durable:
        _fsync(staging / MARKER)
        _fsync(staging)
    if final.exists():  # the same step saved again (e.g. after a resume): swap the old one out
        trash = root / f".trash-{final.name}-{os.getpid()}"
        os.replace(final, trash)
        os.replace(staging, final)
        shutil.rmtree(trash)
    else:
        os.replace(staging, final)  # rename(2): atomic within one filesystem
    if durable:
        _fsync(root)
    prune(root, keep_last)
    logger.debug("checkpoint saved: %s", final)


def remove_leftovers(root: Path, keep: str | None = None) -> None:
    """Staging folders of writers that died mid-save (kill -9, node loss): never complete, never
    read. Those whose names end in `keep` belong to saves in progress and stay."""
    found = [*root.glob(".staging-*"), *root.glob(".trash-*")] if root.is_dir() else []
    for leftover in [path for path in found if keep is None or not path.name.endswith(keep)]:
        logger.debug("removing %s, left by an interrupted save", leftover)
        shutil.rmtree(leftover, ignore_errors=True)


def complete(root: Path) -> list[tuple[int, Path]]:
    """Checkpoints under `root` that have a completion marker, oldest first."""
    if not Path(root).is_dir():
        return []
    found = []
    for child in Path(root).iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / MARKER).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def prune(root: Path, keep_last: int) -> list[Path]:
    """Delete complete checkpoints older than the newest `keep_last`; return what was deleted.

    Each is renamed to `.trash-*` at once (so it is gone for every reader) and its files are
    deleted by a background thread: deleting a large checkpoint would otherwise stall training as
    long as writing one. A trash folder left by an exit mid-delete goes with the next save's
    leftovers; `wait_for_deletes()` waits for them (the Trainer does at the end of fit())."""
    doomed = [path for _, path in complete(root)[:-keep_last]] if keep_last > 0 else []
    trash = []
    for path in doomed:
        trash.append(root / f".trash-{path.name}-{os.getpid()}-{threading.get_ident()}")
        os.replace(path, trash[-1])
    if trash:
        thread = threading.Thread(target=_delete, args=(trash,), name="torchslurm-prune", daemon=True)
        _deleting.append(thread)
        thread.start()
    return doomed


_deleting: list[threading.Thread] = []
"""prune()'s deletions still running in this process."""


def wait_for_deletes() -> None:
    """Return once every old checkpoint handed to the background by prune() is deleted."""
    while _deleting:
        _deleting.pop().join()


def _delete(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _reason(exc: Exception) -> str:
    """The informative line of torch.load's long messages (which also suggest weights_only=False)."""
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text[text.index(marker) + len(marker):]
    return text.strip().split(". ")[0].split("\n")[0]


def folder_of(path: Path) -> Path:
    """The step-N folder of `path` (the folder itself, or its state.pt)."""
    path = Path(path)
    return path.parent if path.name == STATE_FILE else path


def load(path: Path, map_location: str | torch.device = "cpu", verify: bool = True) -> dict[str, Any]:
    """Load one checkpoint's state.pt (`path`: a step-N directory or its state.pt), after verifying
    its marker and the checksum of every file it lists (`verify=False`: trust a check made already)."""
    path = Path(path)
    folder = folder_of(path)
    state_file, marker_file = folder / STATE_FILE, folder / MARKER
    if not state_file.is_file():
        raise CheckpointError(
            f"checkpoint {path}: no {STATE_FILE} in {folder}. Expected a step-N directory written by "
            "torchslurm.",
            "pass resume=<run_dir>/checkpoints/step-NNNNNNNNN, or resume=auto."
        )
    if not marker_file.is_file():
        raise CheckpointError(
            f"checkpoint {folder} has no {MARKER} marker: its writer did not finish.",
            "resume from an older step-N directory, or use resume=auto to pick the newest complete one."
        )
    for name, expected in _expected_files(folder, marker_file).items() if verify else ():
        if not (folder / name).is_file():
            raise CheckpointError(f"checkpoint {folder}: {name} is missing, though its {MARKER} marker lists it.",
                                  "delete this directory; resume=auto then uses the previous complete checkpoint.")
        actual = checksum.of_file(folder / name, checksum.like(expected))
        if actual != expected:
            raise CheckpointError(
                f"checkpoint {folder / name} has checksum {actual[:14]}…, but its marker says {expected[:14]}…: "
                "the file is corrupt or truncated.",
                "delete this directory; resume=auto then uses the "
                "previous complete checkpoint."
            )
    return load_plain(state_file, map_location)


def load_plain(state_file: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A dict of tensors and plain types from one file, never unpickling anything else."""
    try:
        state = torch.load(state_file, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types (pickle, zip, RuntimeError) for bad files
        raise CheckpointError(
            f"checkpoint {state_file} could not be loaded with weights_only=True: {_reason(exc)}.",
            "store only tensors and plain Python types; a corrupt file: delete this directory, "
            "resume=auto then uses the previous one."
        ) from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {state_file} holds a {type(state).__name__}, expected a dict.",
                              "it was not written by torchslurm; pass a torchslurm step-N directory.")
    return state


def _expected_files(folder: Path, marker_file: Path) -> dict[str, str]:
    """File (relative to `folder`) -> checksum, from the marker: `files` in sharded checkpoints, the
    one `sha256` of state.pt in single-file ones."""
    try:
        marker = json.loads(marker_file.read_text())
        files = marker["files"] if "files" in marker else {STATE_FILE: marker["sha256"]}
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise TypeError("files is not a mapping of names to checksums")
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {folder}: unreadable {MARKER} marker ({exc}).",
                              "delete this directory; resume=auto then uses the previous one.") from exc
    if any(Path(name).is_absolute() or ".." in Path(name).parts for name in files):
        raise CheckpointError(f"checkpoint {folder}: its {MARKER} marker names files outside the folder.",
                              "it was not written by torchslurm; delete this directory.")
    return files


def load_latest(root: Path, map_location: str | torch.device = "cpu") -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint that loads; a corrupt newer one is skipped with a warning.
    None when there is no checkpoint at all."""
    candidates = complete(root)
    for _, path in reversed(candidates):
        try:
            return path, load(path, map_location)
        except CheckpointError as exc:
            logger.warning("skipping corrupt checkpoint %s: %s", path, exc)
    if candidates:
        raise CheckpointError(
            f"all {len(candidates)} checkpoints in {root} are corrupt (see the warnings above).",
            f"delete {root} to start afresh, or set resume=never."
        )
    return None


def layout_changes(state: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """What differs between a checkpoint's run and `now` (world_size and config keys) that makes
    its position in the epoch meaningless; '' when nothing does."""
    saved = {"world_size": state["world_size"], **state["config"]}
    return ", ".join(f"{key} was {saved.get(key, 'unset')}, now {value}" for key, value in now.items()
                     if saved.get(key) != value)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices) — call before building the model."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's RNG states as tensors and plain types (loadable with weights_only=True)."""
    version, internal, gauss = random.getstate()
    key, keys, pos, has_gauss, cached = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    return {
        "python": [version, list(internal), gauss],
        "numpy": {"key": key, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["key"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
