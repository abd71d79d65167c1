"""Checkpoint files checksummed while they are written: the checksums COMPLETE records, without
reading a file back.

Each write goes to the file and into the digest at once: a large write is checksummed on a helper
thread while this thread hands the same buffer to the kernel (both release the GIL), so with a
spare core the checksum costs nothing. The digest is of the exact bytes given to the file, as a
read-back from the page cache would give. Nothing here fsyncs: the caller decides when the files
must be on disk (checkpoint.writer); given a `writeback`, a large file's pages go to disk while it
grows (checkpoint.writeback), so that the caller's fsync waits only for the last of them.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, cast

import torch
from torch.utils.serialization import config as serialization_config

from torchslurm.runtime.safefiles import open_write
from torchslurm.train.checkpoint import integrity
from torchslurm.train.checkpoint.writeback import WRITEBACK_BYTES

PARALLEL_BYTES = 1 << 20
"""Writes at least this large are checksummed on the helper thread; smaller ones inline (a hand-off
costs more than a few KiB)."""


SMALL_BATCH = 1 << 16
"""Small writes (torch.save's zip headers, names, pickles: dozens per tensor) are gathered into one
buffer of up to this many bytes, checksummed and written at once: per write, the calls cost more
than the bytes."""


class HashingWriter(io.RawIOBase):
    """A binary file opened for writing whose `hexdigest()` is the checksum of all bytes written;
    `writeback(fd)` is called each time WRITEBACK_BYTES more have reached the file."""

    def __init__(self, file: IO[bytes], pool: ThreadPoolExecutor | None = None,
                 writeback: Callable[[int], None] | None = None) -> None:
        super().__init__()
        self._file, self._pool, self._writeback = file, pool, writeback
        self._digest = integrity.new()
        self._small = bytearray()
        self._unsent = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = data if type(data) is memoryview else memoryview(data)
        size = view.nbytes
        if size < PARALLEL_BYTES:
            self._small += view
            if len(self._small) >= SMALL_BATCH:
                self._write_small()
            return size
        self._write_small()
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        if self._pool is None:
            self._digest.update(view)
            self._file.write(view)
        else:
            hashing = self._pool.submit(self._digest.update, view)
            self._file.write(view)
            hashing.result()  # in order, and the caller may reuse its buffer once write returns
        self._unsent += size
        if self._writeback is not None and self._unsent >= WRITEBACK_BYTES:
            self._file.flush()
            self._writeback(self._file.fileno())
            self._unsent = 0
        return size

    def _write_small(self) -> None:
        if self._small:
            self._digest.update(self._small)
            self._file.write(self._small)
            self._small = bytearray()

    def tell(self) -> int:
        return self._file.tell() + len(self._small)

    def flush(self) -> None:
        self._write_small()
        self._file.flush()

    def close(self) -> None:  # the file is closed by whoever opened it
        self.flush()
        super().close()

    def hexdigest(self) -> str:
        self._write_small()
        return self._digest.hexdigest()


@contextmanager
def without_record_crc32() -> Iterator[None]:
    """torch.save without its crc32 of each zip record (over a third of a bare torch.save's time):
    every checkpoint file has a checksum of all its bytes, checked before it is loaded, and
    torch.load reads such files. The setting is process-wide (torch.utils.serialization.config), so
    only a save that holds up the training thread turns it off; a background save keeps it."""
    with serialization_config.patch({"save.compute_crc32": False}):  # type: ignore[attr-defined]
        yield


def save(obj: object, path: Path, pool: ThreadPoolExecutor | None = None,
         writeback: Callable[[int], None] | None = None) -> str:
    """`torch.save(obj, path)`; returns the file's checksum."""
    with open_write(path, "wb") as file:
        writer = HashingWriter(file, pool, writeback)
        torch.save(obj, cast(IO[bytes], writer))
        writer.flush()
    return writer.hexdigest()
