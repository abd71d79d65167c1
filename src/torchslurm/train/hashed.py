"""Checkpoint files hashed while they are written: the sha256 that COMPLETE records, without reading
the file back.

A checkpoint used to cost reading every file again for its checksum and fsyncing it twice. Here
each write goes to the file and into the digest at once: a large write is hashed on a helper
thread while this thread hands the same buffer to the kernel (both release the GIL), and the disk
is told to start writing it out at once (sync_file_range), so the one fsync per file at its end
waits for little. The digest is of the exact bytes given to the file, as a read-back from the page
cache would give. sha256 itself runs at about 2 GB/s a core: on a machine without a spare core it
stays the largest cost of a synchronous save (docs/training.md has the figures).
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, cast

import torch
from torch.distributed.checkpoint.filesystem import FileSystem

PARALLEL_BYTES = 1 << 20
"""Writes at least this large are hashed on the helper thread; smaller ones inline (a hand-off
costs more than hashing a few KiB)."""


def _libc_sync_file_range() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):  # not Linux
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


_SYNC_FILE_RANGE = _libc_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # sync_file_range(2): start writeback of dirty pages, do not wait


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Let the disk start on these bytes now, so the closing fsync waits for less: the write-out
    overlaps the serialisation and hashing of what follows (where there is no such call: nothing)."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


class HashingWriter(io.RawIOBase):
    """A binary file opened for writing whose `hexdigest()` is the sha256 of all bytes written."""

    def __init__(self, file: IO[bytes], pool: ThreadPoolExecutor | None = None) -> None:
        super().__init__()
        self._file, self._pool = file, pool
        self._digest = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes < PARALLEL_BYTES:
            self._digest.update(view)
            written = self._file.write(view)
            return view.nbytes if written is None else written
        start = self._file.tell()
        hashing = self._pool.submit(self._digest.update, view) if self._pool is not None else None
        if hashing is None:
            self._digest.update(view)
        written = self._file.write(view)
        self._file.flush()
        _start_writeback(self._file.fileno(), start, view.nbytes)
        if hashing is not None:
            hashing.result()  # in order, and the caller may reuse its buffer once write returns
        return view.nbytes if written is None else written

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        self._file.flush()

    def fileno(self) -> int:
        # DCP fsyncs `fileno()` right after its last write (its metadata without a flush): flush here
        # so that the fsync covers every byte
        self._file.flush()
        return self._file.fileno()

    def close(self) -> None:  # the file is closed by whoever opened it
        self.flush()
        super().close()

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


class HashingFileSystem(FileSystem):
    """DCP's local file system, recording the sha256 of every file it writes in `digests`
    (file name -> hex digest; a renamed file keeps its digest under the new name)."""

    def __init__(self, pool: ThreadPoolExecutor | None = None) -> None:
        super().__init__()
        self.digests: dict[str, str] = {}
        self._pool = pool

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with open(path, mode) as file:
            writer = HashingWriter(file, self._pool)
            yield writer
            writer.flush()
        self.digests[Path(path).name] = writer.hexdigest()

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        if Path(path).name in self.digests:
            self.digests[Path(new_path).name] = self.digests.pop(Path(path).name)


@contextmanager
def without_record_crc32() -> Iterator[None]:
    """torch.save without its crc32 of each zip record (over a third of a bare torch.save's time):
    every checkpoint file has a sha256 of all its bytes, checked before it is loaded, and torch.load
    reads such files. The setting is process-wide (torch.utils.serialization.config), so only a save
    that holds up the training thread turns it off; a background save keeps it."""
    from torch.utils.serialization import config

    with config.patch({"save.compute_crc32": False}):  # type: ignore[attr-defined]
        yield


def save(obj: object, path: Path, pool: ThreadPoolExecutor | None = None) -> str:
    """`torch.save(obj, path)`, fsynced; returns the file's sha256."""
    with open(path, "wb") as file:
        writer = HashingWriter(file, pool)
        torch.save(obj, cast(IO[bytes], writer))
        writer.flush()
        os.fsync(file.fileno())
    return writer.hexdigest()
