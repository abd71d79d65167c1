"""A checkpoint file's pages sent to disk while it is still being written.

Writing a file fills the page cache; the fsync that makes it durable then writes all of it to disk
at once, and for a checkpoint of GB that wait comes at the end of a run, after the last epoch's
save (2.9 s for 1.8 GiB on a 2-core VM's disk). A `Writeback` started every WRITEBACK_BYTES of a file
(hashed.HashingWriter) sends what is written so far on a thread of its own, so the disk works while
the file is still being serialized and the final fsync waits only for the last part. It never
makes a file durable by itself: the caller still fsyncs, after `join()`, which raises what failed.
"""

from __future__ import annotations

import os
import threading

WRITEBACK_BYTES = 64 << 20
"""Each time a file has grown by this much, what it holds so far goes to disk (if the last such write
is done: at most one runs, the next one takes everything written meanwhile)."""


class Writeback:
    """The early disk writes of one save's files, one at a time, each on a thread."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: OSError | None = None

    def request(self, fd: int) -> None:
        """Send what the file open as `fd` holds so far to disk, in the background; skipped while the
        last request still runs. The file may be closed meanwhile: the thread syncs its own copy of `fd`."""
        if self._thread is not None and self._thread.is_alive():
            return
        own = os.dup(fd)
        self._thread = threading.Thread(target=self._send, args=(own,), name="torchslurm-writeback", daemon=True)
        self._thread.start()

    def _send(self, fd: int) -> None:
        try:
            os.fdatasync(fd)
        except OSError as exc:  # a failing disk: join() raises it where the save's fsync would
            self._error = self._error or exc
        finally:
            os.close(fd)

    def join(self) -> None:
        """Wait for the request that runs; raise the first error any request met."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
