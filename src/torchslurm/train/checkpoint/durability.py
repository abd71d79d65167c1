"""A checkpoint made durable after the training thread has gone on, and the one message of a save that
failed on the file system (checkpoint.writer writes; this module says when the bytes are on disk and,
if they never get there, why).

A save on the training thread writes its files into the page cache only; Durability fsyncs them on a
thread while training goes on, and the previous checkpoint is kept until every rank has joined it.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

from torchslurm.errors import CheckpointError
from torchslurm.exitcodes import FAILED_EXIT_CODE
from torchslurm.train.checkpoint.layout import fsync
from torchslurm.train.checkpoint.writeback import Writeback


class Durability:
    """A published checkpoint's files, fsynced on a thread after the training thread has gone on.

    A save on the training thread writes its files into the page cache only, checksummed, and
    publishes them; this rank's files (held open, so a rename or another node's view of the folder
    does not matter) and, on rank 0, the marker and the folders are fsynced here. Until every rank
    has joined its Durability, the checkpoint before it is kept (writer.write): a crash meanwhile
    leaves the new one failing its checksums, skipped by resume=auto, and the previous one whole."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.writeback: Writeback | None = None
        """The save's early disk writes, if it made any: joined before the fsyncs."""
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
            if self.writeback is not None:
                self.writeback.join()
            for fd in self._fds:
                os.fsync(fd)
            for path in self._paths:
                fsync(path)
        except OSError as exc:  # reported on the training thread by join()
            self._error = exc
        finally:
            for fd in self._fds:
                os.close(fd)

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise save_failed(self.step, self._error) from self._error


def disk_failure(error: BaseException) -> bool:
    """Whether a failed save failed on the file system (said as such by save_failed), rather than in a
    collective whose peer went away, which must reach the watchdog unchanged."""
    return isinstance(error, CheckpointError) or _os_error(error) is not None


def save_failed(step: int, error: BaseException) -> CheckpointError:
    """The one message of a save that failed, whether it was written on the training thread, in the
    background or made durable afterwards: the cause (a full disk named as such), and the previous
    checkpoint that is still whole. The run fails with FAILED_EXIT_CODE, not as a usage error."""
    if isinstance(error, CheckpointError):
        return error
    error = _os_error(error) or error
    full = isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
    return CheckpointError(
        f"the checkpoint of step {step} could not be written to disk{' (it is full)' if full else ''}: "
        f"{type(error).__name__}: {error}.",
        ("free space (or quota) on run_dir's file system" if full else
         "check free space, permissions and the health of run_dir's file system")
        + "; the checkpoints saved before are kept, and resume=auto continues from the newest.",
        exit_code=FAILED_EXIT_CODE)


def _os_error(error: BaseException) -> OSError | None:
    """The OSError behind `error`: torch.save reports a failed write as a RuntimeError about file
    positions, raised while handling the OSError that says what happened (a full disk)."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None or isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
