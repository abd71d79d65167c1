"""One rank's Python stacks as data: every thread's frames, where the user's code is, and which
collective the rank waits in (if any). Torch-free: the caller hands in the collective count.

A snapshot is taken from another thread (`sys._current_frames()`), which works while the main
thread is blocked in a C call that released the GIL: torch's collectives, `Work.wait()`, a
DataLoader's queue, `time.sleep`, a lock. A thread that holds the GIL in a C loop blocks the
snapshot too; such a rank does not answer, and the report says so.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import sysconfig
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

COLLECTIVE_FILE = "torch/distributed/distributed_c10d.py"
"""Where torch.distributed's collectives are defined: a frame there names the collective."""
BACKWARD_FILE = "torch/autograd/graph.py"
"""Where autograd's backward enters C++: under DDP a rank waits there for its gradient all_reduce."""


@dataclass(frozen=True)
class Frame:
    """One frame: file, line and qualified function name, and whose code it is."""

    file: str
    line: int
    func: str
    kind: str = "user"
    """user (the script and its modules), own (torchslurm) or library (torch, site-packages, the
    standard library)."""

    @property
    def where(self) -> str:
        """file:line with the file's name only (the report's short form)."""
        return f"{Path(self.file).name}:{self.line}"


@dataclass(frozen=True)
class ThreadStack:
    """One thread's frames, outermost first."""

    name: str
    main: bool
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class RankStack:
    """What one rank reports: its threads, its collective count and where it runs."""

    rank: int
    world_size: int
    host: str
    pid: int
    threads: tuple[ThreadStack, ...]
    collectives: int | None = None
    """Collectives this rank has issued on the default group (torch's sequence number), None if unknown."""
    steps: int | None = None
    """Steps this rank has finished (the Trainer's count), None outside the Trainer."""
    taken_at: float = field(default=0.0)
    """time.time() of the snapshot (for the reader only: clocks of nodes differ)."""

    @property
    def main(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.main), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> RankStack:
        data = json.loads(text)
        threads = tuple(ThreadStack(t["name"], t["main"], tuple(Frame(**f) for f in t["frames"]))
                        for t in data.pop("threads"))
        return RankStack(threads=threads, **data)


def frame_kind(file: str, library_roots: Sequence[str], own_root: str) -> str:
    """user, own or library, by where the file lies (pure)."""
    if file.startswith(own_root):
        return "own"
    if file.startswith("<") or any(file.startswith(root) for root in library_roots):
        return "library"
    return "user"


@functools.cache
def library_roots() -> tuple[str, ...]:
    """Folders of code that is not the user's: the standard library and installed packages."""
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[key]) + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")
             if key in paths}
    roots |= {os.path.realpath(p) + os.sep for p in sys.path if "site-packages" in p or "dist-packages" in p}
    return tuple(sorted(roots))


OWN_ROOT = os.path.realpath(str(Path(__file__).parent.parent)) + os.sep
"""The torchslurm package's folder."""


@functools.lru_cache(maxsize=4096)
def _where(filename: str) -> tuple[str, str]:
    """A code object's file, resolved, and its kind (a file's kind never changes: cached)."""
    file = os.path.realpath(filename) if not filename.startswith("<") else filename
    return file, frame_kind(file, library_roots(), OWN_ROOT)


def _frames(frame: FrameType | None) -> tuple[Frame, ...]:
    found: list[Frame] = []
    while frame is not None:
        code = frame.f_code
        file, kind = _where(code.co_filename)
        found.append(Frame(file, frame.f_lineno, code.co_qualname, kind))
        frame = frame.f_back
    return tuple(reversed(found))


def snapshot(rank: int, world_size: int, collectives: int | None = None, steps: int | None = None,
             skip_thread: int | None = None) -> RankStack:
    """Every thread's stack of this process now (`skip_thread`: the ident of the thread asking, left out)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    threads = tuple(
        ThreadStack(names.get(ident, f"thread {ident}"), ident == main_ident, _frames(frame))
        for ident, frame in sys._current_frames().items() if ident != skip_thread)
    threads = tuple(sorted(threads, key=lambda t: (not t.main, t.name)))
    return RankStack(rank, world_size, socket.gethostname(), os.getpid(), threads, collectives, steps, time.time())


def collective_of(frames: Sequence[Frame], distributed: bool = True) -> str | None:
    """The collective a thread waits in: the torch.distributed function on its stack (e.g. all_reduce),
    'backward' when it is in autograd's backward of a distributed run (DDP's gradient all_reduce),
    else None."""
    for frame in frames:
        if frame.file.endswith(COLLECTIVE_FILE) and not frame.func.startswith("_"):
            return frame.func
    if distributed and any(f.file.endswith(BACKWARD_FILE) for f in frames):
        return "backward"
    return None

