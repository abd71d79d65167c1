"""The end of a torchslurm process: Python's exit without the interpreter's teardown."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def exit_process(code: int) -> NoReturn:
    """End this process with `code` as Python's exit would, but without tearing the interpreter down: a
    process that imported torch spends about a second of CPU freeing its modules and objects, longer than
    anything a launcher does after its ranks have finished, and a rank after its last checkpoint
    (docs/benchmarks.md, launch). What Python does first is done: non-daemon threads are joined (a rank's
    last curves.png) once told to end (idle thread pools, such as the compiler's), atexit handlers run
    (logging's flush, the trackers'), stdout and stderr are flushed."""
    _join_threads()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or a pipe nobody reads any more
            stream.flush()
    os._exit(code)


def _join_threads() -> None:
    """What the interpreter does first at exit (CPython's own call): threading's exit hooks, which tell the
    workers of idle thread pools (concurrent.futures) to end, then every non-daemon thread joined. Joining
    without the hooks would wait for those workers forever."""
    threading._shutdown()  # type: ignore[attr-defined]
