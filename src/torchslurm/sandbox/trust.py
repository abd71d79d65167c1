"""Which files the sandbox, run as root, may trust: its lab directory lives in world-writable /tmp,
where any local user can create a directory, a file or a symbolic link first.

A path is trusted when it is no symbolic link, belongs to root (this process's user) and no one
else can write it; a lab directory's parent must let no one else rename it away (root's, and
writable by root alone or sticky like /tmp). Anything else is an error naming the path and its
owner, never silently reused: another user's munge.key would run the cluster on their key, and a
lab directory (or a sandbox.json naming one) that another user made could point root's `down` at
a directory of their choice. `problem` decides from the stat data (pure); the rest are thin effects.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from torchslurm.errors import EnvError

PRIVATE_DIR_MODE = 0o700
"""A lab directory `up` creates: root's alone (its sockets' folders inside open as they need)."""


def problem(path: Path, st: os.stat_result, euid: int, kind: str) -> str | None:
    """Why `path` (lstat'ed as `st`) is not to be trusted by user `euid` as a `kind` ("dir", "file",
    or "parent": a folder holding a trusted one), or None."""
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if kind in ("dir", "parent") and not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if kind == "file" and not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if st.st_uid != euid:
        return f"{path} belongs to uid {st.st_uid}, not to uid {euid} who runs the sandbox"
    others_write = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if others_write and not (kind == "parent" and st.st_mode & stat.S_ISVTX):
        return f"{path} can be written by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def existing(path: Path, kind: str, euid: int | None = None) -> bool:
    """Whether `path` exists; an existing one must be trusted as a `kind` (see `problem`), else an
    EnvError saying why and what to do."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    found = problem(Path(path), st, os.geteuid() if euid is None else euid, kind)
    if found is not None:
        raise untrusted(found, Path(path))
    return True


def untrusted(found: str, path: Path) -> EnvError:
    return EnvError(f"{found}; the sandbox runs as root and does not use files others could have made or "
                    "changed.", f"remove it (as root: rm -r {path}) if it is not yours, or pass another --lab-dir "
                    "in a folder only root can write.")


def make_lab_dir(path: Path, euid: int | None = None) -> None:
    """`path` as a lab directory `up` may fill and `down` may delete: made root's alone when missing;
    an existing one must be trusted, as must its parent."""
    path = Path(path)
    if not existing(path.parent, "parent", euid):
        raise EnvError(f"--lab-dir={path}: its folder {path.parent} does not exist.",
                       f"create it first, as root and writable by root alone (mkdir -p -m 755 {path.parent}), or "
                       "pass a --lab-dir in an existing folder.")
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=PRIVATE_DIR_MODE)
    existing(path, "dir", euid)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on the file `path`, opened without following a link and refused when another
    user made it (a lock in /tmp: anyone may have created the name first)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise untrusted(f"{path} cannot be opened safely ({exc.strerror})", path) from exc
    try:
        found = problem(path, os.fstat(fd), os.geteuid(), "file")
        if found is not None:
            raise untrusted(found, path)
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
