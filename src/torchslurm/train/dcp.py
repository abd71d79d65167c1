"""Sharded checkpoints (format 2), the same for DDP and FSDP: every rank writes its own files and
no rank gathers the model.

    step-000000123/
      shards/          FSDP: model and optimizer tensors, by torch.distributed.checkpoint (DCP),
                       each rank its shard
      tensors.pt       DDP or one process: the same tensors, replicated, in one torch.save by rank 0
      rank-00000.pt    each rank's RNG states and metric sums
      state.pt         rank 0: epoch, position, scaler, scheduler, config, the optimizer's
                       non-tensor settings
      COMPLETE         written last, by rank 0, once every rank said its files are written:
                       the checksum of each file (train.checksum)

The folder is written as `.staging-<step>-<attempt>` and renamed (checkpoint.publish). Loading goes through
`get_state_dict`/`set_state_dict` with the optimizer flattened to parameter names, so a run saved
on 4 ranks loads on 2 or 3: DCP reads whatever part of each tensor a rank now holds, and a
replicated checkpoint loads into shards as well (and shards into replicas). DCP's reader is given
a restricted unpickler for its `.metadata`; everything else is a `torch.load(weights_only=True)`
file: a load never unpickles arbitrary objects. Replicated tensors skip DCP because its planning
and per-tensor writes cost a small model's save 1.5 ms more than the bytes do (7× torch.save).

A save on the training thread costs what writing the bytes into the page cache costs: files are
checksummed beside the write and fsynced afterwards on a thread (Durability), while the previous
checkpoint is kept until they are. Asynchronous saves stage the tensors to CPU memory at the step
boundary, then a thread writes them, fsyncs them and finishes the checkpoint over a Gloo group of
its own, so the training loop's collectives never meet the writer's.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.tensor import DTensor, distribute_tensor

from torchslurm.errors import CheckpointError
from torchslurm.train import checkpoint, hashed

logger = logging.getLogger(__name__)

FORMAT = 2
_WRAPPERS: tuple[type, ...] = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
_WRAPPER_PARTS = frozenset({"_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_flat_param"})
"""Names that torch.compile, activation checkpointing and FSDP1 put into parameter names and
get_state_dict takes out."""
SHARDS = "shards"
TENSORS_FILE = "tensors.pt"
_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def split_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensors for DCP, everything else) of model and optimizer, keyed `model.<name>` and
    `optim.<flattened name>`. The tensors are the live ones (DTensor shards under FSDP)."""
    model_sd, optim_sd = _plain_state_dict(model, optimizer) or get_state_dict(model, optimizer, options=_FLAT)
    tensors: dict[str, Any] = {}
    plain: dict[str, Any] = {}
    for prefix, part in (("model.", model_sd), ("optim.", optim_sd)):
        for key, value in part.items():
            (tensors if isinstance(value, torch.Tensor) else plain)[prefix + key] = value
    return tensors, plain


def _plain_state_dict(model: nn.Module,
                      optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """get_state_dict(model, optimizer, flattened) of a plain module (no wrapper, no DTensor, no
    parameter under two names), built directly: DCP's version costs 5 ms a save for a 100-tensor
    model, mostly in mapping names it has to expect wrappers in. None for any other module, and for
    an optimizer without state yet (DCP creates it, and loading needs those targets)."""
    named = list(model.named_parameters(remove_duplicate=False))
    names = {id(p): name for name, p in named}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    model_sd = model.state_dict()
    if (not optimizer.state or isinstance(model, _WRAPPERS) or len(names) != len(named)
            or any(part in _WRAPPER_PARTS for key in model_sd for part in key.split("."))
            or any(isinstance(p, DTensor) or id(p) not in names for p in params)):
        return None
    optim: dict[str, Any] = {}
    for p in params:
        for key, value in optimizer.state.get(p, {}).items():
            optim[f"state.{names[id(p)]}.{key}"] = value
    for group in optimizer.param_groups:
        settings = {key: value for key, value in group.items() if key != "params"}
        for p in group["params"]:
            for key, value in settings.items():
                optim[f"param_groups.{names[id(p)]}.{key}"] = value
    return model_sd, optim


def local_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    """The bytes of `tensors` this rank holds (a DTensor's local shard)."""
    local = (v.to_local() if isinstance(v, DTensor) else v for v in tensors.values())
    return sum(t.numel() * t.element_size() for t in local)


def stage(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies in CPU memory (DTensors stay DTensors), so training may change the originals."""
    return {k: v.detach().to("cpu") if v.device.type != "cpu" else v.detach().clone() for k, v in tensors.items()}


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


class Durability:
    """A published checkpoint's files, fsynced on a thread after the training thread has gone on.

    A save on the training thread writes its files into the page cache only, checksummed, and
    publishes them; this rank's files (held open, so a rename or another node's view of the folder
    does not matter) and, on rank 0, the marker and the folders are fsynced here. Until every rank
    has joined its Durability, the checkpoint before it is kept (see `write`): a crash meanwhile
    leaves the new one failing its checksums, skipped by resume=auto, and the previous one whole."""

    def __init__(self) -> None:
        self._fds: list[int] = []
        self._paths: list[Path] = []
        self._thread: threading.Thread | None = None
        self._error: OSError | None = None

    def hold(self, path: Path) -> None:
        self._fds.append(os.open(path, os.O_RDONLY))

    def after_rename(self, *paths: Path) -> None:
        self._paths.extend(paths)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._sync, name="torchslurm-fsync", daemon=True)
        self._thread.start()

    def _sync(self) -> None:
        try:
            for fd in self._fds:
                os.fsync(fd)
            for path in self._paths:
                checkpoint.fsync(path)
        except OSError as exc:  # reported on the training thread by join()
            self._error = exc
        finally:
            for fd in self._fds:
                os.close(fd)

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise CheckpointError(f"a checkpoint could not be written to disk: {self._error}.",
                                  "check free space and the health of run_dir's file system; the previous "
                                  "checkpoint is kept.") from self._error


def write(snap: Snapshot, group: dist.ProcessGroup | None = None, later: Durability | None = None,
          attempt: str | None = None) -> Path:
    """Write `snap` on every rank of `group` and publish the checkpoint once all agree; returns its folder
    (published on return on rank 0; on the others once rank 0 is done, which the next save or
    `Writer.finish` waits for).

    All ranks call it. Each writes its files into `.staging-<step>-<attempt>` (`attempt` names this
    run's saves, the same on every rank: see `agree_attempt`) and reports their checksums; rank 0
    clears what interrupted saves of other attempts left, writes COMPLETE with every checksum and
    renames the folder. Replicated tensors (DDP, one process) are written by rank 0 alone, in one
    file; sharded ones (FSDP's DTensors) by every rank its own shard, through DCP. One all_gather of
    the checksums is then the only collective of a replicated save.

    Without `later` every file is fsynced before COMPLETE is written, and all but `keep_last`
    checkpoints are deleted. With `later` (a save that holds up training) nothing is fsynced here:
    `later` does it once started, and the caller joins it before its next save. Each rank joins its
    own before it sends its checksums, so by the time rank 0 prunes, the checkpoint before this one
    is on disk everywhere: it keeps that one and `keep_last` in all, not counting this one. Such a
    save also leaves out torch.save's redundant crc32s."""
    rank = dist.get_rank() if _distributed() else 0
    attempt = agree_attempt(group) if attempt is None else attempt
    final = checkpoint.step_dir(snap.root, snap.step)
    staging = snap.root / f".staging-{snap.step:09d}-{attempt}"
    if rank == 0:
        checkpoint.remove_leftovers(snap.root, keep=f"-{attempt}")
    sharded = _sharded(snap.tensors)
    (staging / SHARDS if sharded else staging).mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(1, thread_name_prefix="torchslurm-checksum") as pool, \
            nullcontext() if later is None else hashed.without_record_crc32():
        mine = _write_files(snap, staging, rank, group, pool, sync=later is None, sharded=sharded)
    if later is not None:
        for name in mine:
            later.hold(staging / name)
    everyone: list[Any] = [mine]
    if _distributed():
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, mine, group=group)
    if rank == 0:
        if snap.publish_after is not None:
            snap.publish_after.wait()
        files = {name: digest for part in everyone for name, digest in part.items()}
        marker = {"step": snap.step, "format": FORMAT, "files": dict(sorted(files.items()))}
        (staging / checkpoint.MARKER).write_text(json.dumps(marker) + "\n")
        folders = [SHARDS] if sharded else []
        if later is None:
            for folder in folders:
                checkpoint.fsync(staging / folder)
            checkpoint.publish(staging, final, snap.keep_last)
        else:
            checkpoint.publish(staging, final, snap.keep_last + 1, durable=False)
            later.after_rename(final / checkpoint.MARKER, *(final / folder for folder in folders), final, snap.root)
    if later is not None:
        later.start()
    return final


def agree_attempt(group: dist.ProcessGroup | None = None) -> str:
    """A name for this run's saves, the same on every rank (rank 0's process id and start time):
    staging folders of other attempts are leftovers, this one's never are (a collective)."""
    mine = [f"{os.getpid():x}{time.time_ns() // 1_000_000:x}"]
    if _distributed():
        dist.broadcast_object_list(mine, src=0, group=group)
    return str(mine[0])


def _sharded(tensors: Mapping[str, Any]) -> bool:
    return any(isinstance(value, DTensor) for value in tensors.values())


def _write_files(snap: Snapshot, staging: Path, rank: int, group: dist.ProcessGroup | None,
                 pool: ThreadPoolExecutor, sync: bool, sharded: bool) -> dict[str, str]:
    """This rank's files of the checkpoint, each checksummed while written and, if `sync`, fsynced
    (DCP fsyncs its own, sync_files); -> file (relative to `staging`) -> checksum."""
    mine = {}
    if sharded:
        fs = hashed.HashingFileSystem(pool)
        writer = FileSystemWriter(staging / SHARDS, sync_files=sync)
        writer.fs = fs
        with _quiet_alone():
            dcp_save(snap.tensors, storage_writer=writer, process_group=group, no_dist=not _distributed())
        mine = {f"{SHARDS}/{name}": digest for name, digest in fs.digests.items()}
    own = {rank_file(rank): snap.rank_state}
    if rank == 0 and not sharded:  # on the CPU (no copy there), so that it loads anywhere, memory-mapped
        own[TENSORS_FILE] = {key: value.detach().cpu() for key, value in snap.tensors.items()}
    if snap.trainer_state is not None:
        own[checkpoint.STATE_FILE] = snap.trainer_state
    for name, state in own.items():
        mine[name] = hashed.save(state, staging / name, pool)
        if sync:
            checkpoint.fsync(staging / name)
    return mine


@contextmanager
def _quiet_alone() -> Iterator[None]:
    """DCP warns that it assumes one process when told to work alone (no_dist): here that is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier(group: dist.ProcessGroup | None) -> None:
    if _distributed():
        dist.barrier(group=group)


class Writer:
    """Every checkpoint of a run: written now, on the training thread, or in the background, at most
    one at a time.

    `save(snap)` writes it now and leaves only the fsyncs to a thread (`Durability`);
    `stage()` copies tensors for a background save and `start(snap)` begins one, on a Gloo group of
    its own, durable before it is published (or, `defer_fsync`, fsynced afterwards as `save` does).
    `wait_written()` returns once a background save is published, `wait()` once the last save is
    also on disk; both re-raise a background error on the training thread. `finish()` is the end of
    a run on every rank: wait, then the older checkpoints beyond keep_last go."""

    def __init__(self) -> None:
        self._group: dist.ProcessGroup | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._durability: Durability | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        self._attempt: str | None = None
        self.last: Path | None = None

    def save(self, snap: Snapshot) -> Path:
        self.wait()
        self._durability = Durability()
        self.last = write(snap, later=self._durability, attempt=self.attempt())
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
        if self._group is None and _distributed():
            self._group = dist.new_group(backend="gloo")
            dist.barrier(group=self._group)  # its connections made now, not in the first save

    def start(self, snap: Snapshot, defer_fsync: bool = False) -> None:
        """Write `snap` in the background: staged tensors, or live ones that nothing changes until
        `wait_written()` returns (the Trainer's epoch-end save beside validation, which also defers
        its fsyncs as `save` does); otherwise it is on disk before it is published."""
        self.wait()
        self.open()
        self._durability = Durability() if defer_fsync else None
        self._thread = threading.Thread(target=self._run, args=(snap, self._durability),
                                        name="torchslurm-checkpoint", daemon=True)
        self._thread.start()

    def _run(self, snap: Snapshot, later: Durability | None) -> None:
        try:
            self.last = write(snap, self._group, later=later, attempt=self._attempt)
        except BaseException as exc:  # reported on the training thread by wait()
            self._error = exc

    def wait(self) -> Path | None:
        """Until the last save is published and on disk."""
        self.wait_written()
        if self._durability is not None:
            durability, self._durability = self._durability, None
            durability.join()
        return self.last

    def wait_written(self) -> Path | None:
        """Until a background save is published (its fsyncs may still run)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"the background checkpoint save failed: {type(error).__name__}: {error}",
                                  "check free space and permissions of run_dir; the previous checkpoint "
                                  "is still complete.") from error
        return self.last

    def finish(self, root: Path, keep_last: int) -> None:
        """The end of a run, on every rank: the last checkpoint on disk everywhere, then rank 0
        deletes what `save` had to keep beyond `keep_last` while it was not."""
        self.wait()
        _barrier(None)
        if not _distributed() or dist.get_rank() == 0:
            checkpoint.prune(root, keep_last)


# ---- loading ------------------------------------------------------------------------------------
_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
                     "torch.distributed.checkpoint.planner")


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's `.metadata` holds its own dataclasses, torch.Size and dtypes: nothing else is let in."""

    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name)
        if module in _METADATA_MODULES and isinstance(found, type):
            return found
        if module == "torch" and (found is torch.Size or isinstance(found, torch.dtype | torch.layout |
                                                                     torch.memory_format)):
            return found
        if (module, name) in (("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                              ("builtins", "set"), ("builtins", "frozenset"),
                              ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
                              ("pathlib", "PureWindowsPath")):
            return found
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in checkpoint metadata")


class SafeReader(FileSystemReader):
    """DCP's file reader, reading `.metadata` with the restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = Path(self.path) / (".metadata" if kwargs.get("rank") is None else f"__{kwargs['rank']}.metadata")
        try:
            metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint metadata {path} cannot be read safely: {exc}.",
                                  "it was not written by torchslurm, or is corrupt; delete this directory.") from exc
        from torch.distributed.checkpoint.metadata import StorageMeta

        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def load_into(folder: Path, state: Mapping[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Model and optimizer from `folder`'s tensors (and `state`, its state.pt), spread however they
    are spread now: shards resharded, replicated tensors sharded. Every rank calls it."""
    tensors, _ = split_state(model, optimizer)  # targets shaped as now (optimizer state initialised)
    if (folder / TENSORS_FILE).is_file():
        saved = _read_replicated(folder)
        _check_same_tensors(folder, saved, tensors)
        tensors = {key: _spread_like(saved[key], target) for key, target in tensors.items()}
    else:
        with _quiet_alone():
            dcp_load(tensors, storage_reader=SafeReader(folder / SHARDS), no_dist=not _distributed())
    values = {**tensors, **state["optim_plain"]}
    model_sd, optim_sd = _part(values, "model."), _part(values, "optim.")
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=_FLAT)


def _part(values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The entries of `values` under `prefix` ("model." or "optim."), keyed without it."""
    return {k.removeprefix(prefix): v for k, v in values.items() if k.startswith(prefix)}


def _read_replicated(folder: Path) -> dict[str, torch.Tensor]:
    """tensors.pt, mapped rather than read: every rank of a node shares its pages."""
    loaded = torch.load(folder / TENSORS_FILE, map_location="cpu", weights_only=True, mmap=True)
    return cast(dict[str, torch.Tensor], loaded)


def _spread_like(whole: torch.Tensor, target: Any) -> Any:
    """A whole tensor as `target` is held now: the same DTensor shard of it (cut locally, no
    collective), or itself."""
    if not isinstance(target, DTensor):
        return whole
    return distribute_tensor(whole.to(target.device), target.device_mesh, target.placements, src_data_rank=None)


def _check_same_tensors(folder: Path, saved: Mapping[str, torch.Tensor], wanted: Mapping[str, Any]) -> None:
    """The checkpoint holds every tensor the model and optimizer now have, in their (whole) shapes."""
    missing = sorted(wanted.keys() - saved.keys())
    unexpected = sorted(saved.keys() - wanted.keys())
    reshaped = sorted(k for k in wanted.keys() & saved.keys() if tuple(wanted[k].shape) != tuple(saved[k].shape))
    if missing or unexpected or reshaped:
        found = "; ".join(f"{what}: {', '.join(keys[:4])}{' …' if len(keys) > 4 else ''}" for what, keys in
                          (("missing", missing), ("not in the model", unexpected), ("other shape", reshaped)) if keys)
        raise CheckpointError(f"checkpoint {folder} was saved from another model or optimizer ({found}).",
                              "resume with the model and optimizer it was trained with, or start over "
                              "with resume=never or a new run_dir.")


def load_single_file(state: Mapping[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A format-1 checkpoint (the whole model and optimizer in state.pt, saved by rank 0) into a
    plain or FSDP-sharded model: its optimizer state is keyed by parameter position, named here."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    saved = state["optimizer"]
    optim_sd: dict[str, Any] = {
        "state": {order[int(i)]: v for i, v in saved["state"].items()},
        "param_groups": [{**g, "params": [order[int(i)] for i in g["params"]]} for g in saved["param_groups"]],
    }
    set_state_dict(model, optimizer, model_state_dict=dict(state["model"]), optim_state_dict=optim_sd,
                   options=StateDictOptions(full_state_dict=True))


def read_model(folder: Path) -> dict[str, torch.Tensor]:
    """The whole model state of a checkpoint as CPU tensors, read in this one process (no process
    group): for inspecting or exporting a checkpoint, e.g. `torch.save(read_model(step), "model.pt")`."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    folder = Path(folder)
    if (folder / TENSORS_FILE).is_file():
        return _part(_read_replicated(folder), "model.")
    reader = SafeReader(folder / SHARDS)
    metadata = reader.read_metadata()
    model = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in metadata.state_dict_metadata.items()
             if k.startswith("model.") and isinstance(m, TensorStorageMetadata)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_load(model, storage_reader=SafeReader(folder / SHARDS), no_dist=True)
    return _part(model, "model.")
