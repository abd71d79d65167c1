"""Reading checkpoint files without ever unpickling code: `torch.load(weights_only=True)` for every
torch.save file, and DCP's `.metadata` through an unpickler that lets in only DCP's own types.
Loading verifies the COMPLETE marker's checksums first (checkpoint.integrity)."""

from __future__ import annotations

import io
import logging
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader

from torchslurm.errors import CheckpointError
from torchslurm.train.checkpoint import integrity
from torchslurm.train.checkpoint.layout import MARKER, STATE_FILE, complete, folder_of

logger = logging.getLogger(__name__)


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
    if verify:
        integrity.verify(folder)
    return load_plain(state_file, map_location)


def load_plain(state_file: Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict[str, Any]:
    """A dict of tensors and plain types from one file, never unpickling anything else (`mmap`: its
    tensors mapped from the file, read as they are used)."""
    try:
        state = torch.load(state_file, map_location=map_location, weights_only=True, mmap=mmap)
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


def _reason(exc: Exception) -> str:
    """The informative line of torch.load's long messages (which also suggest weights_only=False)."""
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text[text.index(marker) + len(marker):]
    return text.strip().split(". ")[0].split("\n")[0]


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
    """DCP's file reader that never unpickles code: `.metadata` is read with the restricted unpickler
    and must describe tensors only, in files of its own folder. DCP's default planner loads an entry
    the metadata calls bytes with `torch.load(weights_only=False)`, which runs whatever the pickle
    says; torchslurm's checkpoints hold no such entry, so one is refused before anything is read
    (checksums do not help: whoever writes the files can write COMPLETE too). Rank-local metadata,
    which torchslurm never writes, is refused as well."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._metadata: Any = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = Path(self.path) / ".metadata"
        if kwargs.get("rank") is not None:
            raise CheckpointError(f"checkpoint {path} is missing or unreadable (DCP asked for rank-local metadata).",
                                  "it was not written by torchslurm, or is incomplete; delete this directory.")
        if self._metadata is None:
            self._metadata = _read_metadata(path)
        metadata = self._metadata
        from torch.distributed.checkpoint.metadata import StorageMeta

        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: Any, planner: Any) -> Any:
        from torch.distributed.checkpoint.planner import LoadItemType

        pickled = sorted({item.dest_index.fqn for item in plan.items if item.type == LoadItemType.BYTE_IO})
        if pickled:
            raise _pickled_entries(Path(self.path) / ".metadata", pickled)
        return super().read_data(plan, planner)


def _read_metadata(path: Path) -> Any:
    """DCP's metadata from `path`, through the restricted unpickler, checked to hold tensors only."""
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

    try:
        metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError, IndexError) as exc:
        raise CheckpointError(f"checkpoint metadata {path} cannot be read safely: {exc}.",
                              "it was not written by torchslurm, or is corrupt; delete this directory.") from exc
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise CheckpointError(f"checkpoint metadata {path} holds a {type(metadata).__name__}, expected DCP's "
                              "Metadata.", "it was not written by torchslurm; delete this directory.")
    pickled = sorted(str(key) for key, entry in metadata.state_dict_metadata.items()
                     if not isinstance(entry, TensorStorageMetadata))
    if pickled:
        raise _pickled_entries(path, pickled)
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
            raise CheckpointError(f"checkpoint metadata {path} points at {name!r}, outside its folder; expected "
                                  "file names in it (e.g. __0_0.distcp).",
                                  "it was not written by torchslurm; delete this directory.")
    return metadata


def _pickled_entries(path: Path, names: list[str]) -> CheckpointError:
    shown = ", ".join(names[:4]) + (" …" if len(names) > 4 else "")
    return CheckpointError(
        f"checkpoint {path}: {shown} {'is' if len(names) == 1 else 'are'} stored as pickled bytes, which loading "
        "would unpickle (and so could run code); torchslurm checkpoints hold tensors only, so this is refused.",
        "it was not written by torchslurm, or was altered: delete this step-N directory (resume=auto then uses "
        "the previous one), or resume from a checkpoint you trust.")
