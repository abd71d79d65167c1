"""`outcome.json` in the run_dir: how the Trainer's fit ended, for `torchslurm sweep` and `results`
(the format is jobs.sweepstate.Outcome's, the one home of it).

Rank 0 writes `completed` or `stopped` when fit returns; a rank whose fit raises writes `failed`
with the error in one line (several may: each write replaces the file whole, so readers see one
of them, never a mix). Written through runtime.safefiles (a fresh file renamed into place, never
through a planted link); a file that cannot be written is logged, and never hides the run's own
error or result. Torch-free.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from torchslurm.errors import TorchSlurmError
from torchslurm.jobs.sweepstate import OUTCOME_FILE, Outcome
from torchslurm.runtime import safefiles
from torchslurm.train.requeue import plan_requeue

if TYPE_CHECKING:
    from torchslurm.train.preemption import Preemption

logger = logging.getLogger(__name__)


def one_line(exc: BaseException) -> str:
    """The failure in one line: a TorchSlurmError's message (its first line), else `Type: message`."""
    text = exc.message if isinstance(exc, TorchSlurmError) else f"{type(exc).__name__}: {exc}".rstrip(": ")
    first = text.strip().split("\n", 1)[0].strip()
    return first[:500] or type(exc).__name__


def write(run_dir: Path, outcome: Outcome) -> Path | None:
    """Write `<run_dir>/outcome.json` whole; None (logged) when it cannot be written."""
    path = Path(run_dir) / OUTCOME_FILE
    try:
        safefiles.replace(path, outcome.to_json())
    except (OSError, TorchSlurmError) as exc:
        logger.warning("could not write %s: %s", path, exc)
        return None
    return path


class RunOutcome:
    """Around one fit: `ended(...)` when it returns (rank 0 writes), `failed` from __exit__ when it
    raises (the raising rank writes). `where()` says (epochs done, step) at the time."""

    def __init__(self, run_dir: Path, rank: int, where: Callable[[], tuple[int, int]],
                 clock: Callable[[], float] = time.time, timer: Callable[[], float] = time.monotonic) -> None:
        self.run_dir, self.rank, self._where = Path(run_dir), rank, where
        self._clock, self._timer = clock, timer
        self._started = 0.0

    def __enter__(self) -> RunOutcome:
        self._started = self._timer()
        return self

    def ended(self, stopped: bool, requeued: bool = False) -> None:
        """Rank 0: the fit returned, finished (`stopped` False) or stopped early with a checkpoint."""
        if self.rank == 0:
            self._write("stopped" if stopped else "completed", None, requeued and stopped)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and isinstance(exc, Exception | KeyboardInterrupt):
            self._write("failed", one_line(exc), False)

    def _write(self, state: str, error: str | None, requeued: bool) -> None:
        epochs, step = self._where()
        write(self.run_dir, Outcome(state, epochs, step, round(self._timer() - self._started, 3), self._clock(),
                                    error, self.rank, requeued))


def requeued(preemption: Preemption | None) -> bool:
    """Whether the Trainer's own preemption requeues the job after its stop (rank 0 does, in
    Preemption.finish, as train.requeue.plan_requeue decides); False with a should_stop of the caller's."""
    if preemption is None:
        return False
    plan = plan_requeue(preemption.environ, preemption.config.max_requeues, preemption.request.wants_requeue)
    return plan.target is not None
