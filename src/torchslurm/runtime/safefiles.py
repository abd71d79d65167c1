"""Files torchslurm creates in folders that someone else may be able to write (a run_dir on a shared
file system, a folder in /tmp): opened without following a symbolic link planted under their name,
so that a write never lands in (or truncates) the file the link points to.

    open_new(path)         a file that must not exist yet (O_EXCL: neither a file nor a link)
    open_write(path)       created or truncated, never through a link (O_NOFOLLOW)
    open_append(path)      created or appended to, never through a link
    replace(path, data)    written whole to a fresh file beside it, then renamed over it: rename(2)
                           replaces a link itself, never its target

O_NOFOLLOW guards the last part of the path only; the folders on the way are the caller's (a
run_dir only its owner can write: docs/security.md). A link found where a file is written is a
TorchSlurmError naming it, not an OSError.
"""

from __future__ import annotations

import errno
import os
import secrets
import shlex
from pathlib import Path
from typing import IO, Any

from torchslurm.errors import TorchSlurmError

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def open_new(path: Path, mode: str = "w") -> IO[Any]:
    """`path` created, opened for writing (`mode` "w" or "wb"); FileExistsError when anything, a
    link included, is there already."""
    return _fdopen(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)


def open_write(path: Path, mode: str = "w") -> IO[Any]:
    """`path` created or truncated and opened for writing (`mode` "w" or "wb"), never through a link."""
    return _fdopen(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)


def open_append(path: Path, mode: str = "a") -> IO[Any]:
    """`path` created or opened at its end (`mode` "a" or "ab"), never through a link."""
    return _fdopen(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode)


def replace(path: Path, data: str | bytes) -> None:
    """`path` holds `data` whole, or what it held before: readers never see half of it."""
    path = Path(path)
    staging = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with open_new(staging, "wb" if isinstance(data, bytes) else "w") as out:
            out.write(data)
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def _fdopen(path: Path, flags: int, mode: str) -> IO[Any]:
    try:
        fd = os.open(path, flags | _NOFOLLOW, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise planted_link(Path(path)) from exc
        raise
    return os.fdopen(fd, mode)


def planted_link(path: Path) -> TorchSlurmError:
    """The error for a symbolic link where torchslurm writes a file of its own."""
    return TorchSlurmError(
        f"{path} is a symbolic link; torchslurm writes its own files there and does not follow links it did "
        "not make (the write would land in the file the link points to).",
        f"remove the link (rm {shlex.quote(str(path))}); if you did not make it, another user can write to "
        f"{path.parent}: use a folder only you can write to.")
