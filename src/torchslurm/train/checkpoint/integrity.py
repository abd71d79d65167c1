"""The checksums a checkpoint's COMPLETE marker records for its files, and their verification.

New checkpoints record `crc32:<8 hex digits>` (zlib's CRC-32, as zip and torch.save use): it finds
the truncated, partly written or bit-flipped files a crash or a full disk leaves, at about 6 GB/s a
core, three times sha256's speed, so hashing a shard beside its write costs no time. The checksum
is not a defence against someone who forges checkpoints (no hash in the same folder could be).
Markers written before record a bare sha256 hex digest; those are still verified as sha256.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path
from typing import Any, Protocol

from torchslurm.errors import CheckpointError
from torchslurm.train.checkpoint.layout import MARKER, STATE_FILE

CRC32 = "crc32:"
_BLOCK = 1 << 20


class Digest(Protocol):
    def update(self, data: Any, /) -> None: ...

    def hexdigest(self) -> str: ...


class Crc32:
    """A running CRC-32 with hashlib's interface; `hexdigest()` is the marker's `crc32:` form.
    zlib.crc32 releases the GIL for buffers of a few KiB and more."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: Any, /) -> None:
        self._value = zlib.crc32(data, self._value)

    def hexdigest(self) -> str:
        return f"{CRC32}{self._value:08x}"


def new() -> Digest:
    """The digest new checkpoints record."""
    return Crc32()


def like(recorded: str) -> Digest:
    """An empty digest of the kind `recorded` is: crc32 or, in older markers, sha256."""
    return Crc32() if recorded.startswith(CRC32) else hashlib.sha256()


def of_file(path: Path, digest: Digest) -> str:
    """`digest` fed with all of `path`'s bytes, as its hexdigest()."""
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(folder: Path) -> None:
    """Every file the marker of `folder` lists is there and has the checksum it records."""
    marker_file = folder / MARKER
    for name, expected in expected_files(folder, marker_file).items():
        if not (folder / name).is_file():
            raise CheckpointError(f"checkpoint {folder}: {name} is missing, though its {MARKER} marker lists it.",
                                  "delete this directory; resume=auto then uses the previous complete checkpoint.")
        actual = of_file(folder / name, like(expected))
        if actual != expected:
            raise CheckpointError(
                f"checkpoint {folder / name} has checksum {actual[:14]}…, but its marker says {expected[:14]}…: "
                "the file is corrupt or truncated.",
                "delete this directory; resume=auto then uses the "
                "previous complete checkpoint."
            )


def expected_files(folder: Path, marker_file: Path) -> dict[str, str]:
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
