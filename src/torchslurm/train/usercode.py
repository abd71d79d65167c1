"""An exception raised by the code a user gives the Trainer (the model's forward, `loss_fn`, a `step`),
told as theirs: the rank, where in their code, the exception. Without this, a shape bug raised as a
RuntimeError on every rank reached the watchdog, which reads a RuntimeError as a failed collective and
reported "a collective failed while every rank still has a heartbeat", with a hint about networks.

Errors that are not the user's pass unchanged: torchslurm's own (already framed), a collective that
failed inside the forward (FSDP all-gathers there; DDP may broadcast buffers), and a device's own
error (CUDA, cuBLAS, cuDNN: train.badnodes decides whether the node is at fault).
"""

from __future__ import annotations

import sysconfig
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torchslurm.errors import TorchSlurmError, UserCodeError
from torchslurm.train.badnodes import own_error

__all__ = ["culprit", "from_collective", "user_code", "user_error"]

_TORCHSLURM = str(Path(__file__).resolve().parents[1])
_COLLECTIVE_PARTS = ("torch/distributed/", "torch/nn/parallel/")
"""Where torch runs collectives in a forward (FSDP's all-gathers, DDP's buffer broadcast)."""


def _library_roots() -> tuple[str, ...]:
    """torchslurm, torch and the Python standard library: code that is not the user's."""
    import torch

    roots = [_TORCHSLURM, str(Path(torch.__file__).resolve().parent)]
    roots += [str(Path(p).resolve()) for key in ("stdlib", "platstdlib") if (p := sysconfig.get_paths().get(key))]
    return tuple(roots)


def culprit(frames: traceback.StackSummary, libraries: tuple[str, ...]) -> traceback.FrameSummary | None:
    """The innermost frame of the user's code in `frames` (outermost first): the deepest outside
    `libraries`; when every frame is in them, the deepest outside torchslurm (e.g. torch's
    cross_entropy called directly as the loss_fn)."""
    def inside(frame: traceback.FrameSummary, roots: tuple[str, ...]) -> bool:
        name = str(Path(frame.filename).resolve()) if not frame.filename.startswith("<") else frame.filename
        return name.startswith(roots)

    for roots in (libraries, (_TORCHSLURM,)):
        found = [frame for frame in frames if not inside(frame, roots)]
        if found:
            return found[-1]
    return None


def from_collective(exc: BaseException) -> bool:
    """Whether `exc` is a failed collective: torch's distributed error types, or an error raised in
    torch's distributed code (Gloo's errors are plain RuntimeErrors)."""
    import torch.distributed as dist

    if isinstance(exc, dist.DistError):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and any(part in frames[-1].filename.replace("\\", "/") for part in _COLLECTIVE_PARTS)


def user_error(rank: int, what: str, exc: BaseException, libraries: tuple[str, ...] | None = None) -> UserCodeError:
    """The error that reports `exc`, raised by `what` (e.g. "the model's forward") on `rank`."""
    frame = culprit(traceback.extract_tb(exc.__traceback__), libraries or _library_roots())
    where = f" at {frame.filename}:{frame.lineno} (in {frame.name})" if frame else ""
    lines = str(exc).strip().splitlines()
    text = f": {lines[0]}" if lines else ""
    return UserCodeError(
        f"rank {rank}: {what} raised {type(exc).__name__}{where}{text}",
        "this is an error in the code given to the Trainer, not a distributed failure; its traceback is above. "
        "A run on one process (python your_script.py) fails the same way and is the easiest to debug.")


@contextmanager
def user_code(rank: int, what: str) -> Iterator[None]:
    """Run the user's code; an exception of theirs becomes a UserCodeError (its cause kept, so the
    traceback shows where)."""
    try:
        yield
    except TorchSlurmError:
        raise
    except Exception as exc:
        if from_collective(exc) or own_error(str(exc)):
            raise
        raise user_error(rank, what, exc) from exc
