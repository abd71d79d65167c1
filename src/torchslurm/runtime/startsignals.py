"""The preemption warning signal during a rank's start-up: recorded, never fatal.

Slurm's `--signal` (USR2 by default) goes to every process of the job's steps, whenever its time comes,
also while a rank is still importing torch, loading data or building its model. Until the Trainer
installs its handlers (train.preemption), USR1 and USR2 would end the process (their default action).
So the generated job script starts each rank with the signal ignored (`trap ""`, inherited across
exec), `torchslurm.init()` then puts a handler in place that only records it (`hold`), and the
Trainer's handlers take over what was recorded (`handed_over`), so that a signal received during
start-up is still a stop. Signal handlers are process-wide: this module's record is too.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping
from types import FrameType
from typing import Any

WARNING_VARIABLE = "TORCHSLURM_PREEMPT_SIGNAL"
"""The job's warning signal, written by the generated job script (jobs.sbatch)."""
HELD_NOT = ("TERM", "INT", "HUP")
"""Signals never held: they also mean "end now" (scancel, Ctrl-C, a lost terminal)."""

_before: dict[int, Any] = {}  # a held signal -> what handled it before hold()
_arrived: set[int] = set()


def held_signal(environ: Mapping[str, str]) -> signal.Signals | None:
    """The warning signal a rank holds during start-up: the job's (WARNING_VARIABLE), unless it is one
    of HELD_NOT or no signal at all."""
    name = environ.get(WARNING_VARIABLE, "").strip().upper().removeprefix("SIG")
    if not name or name in HELD_NOT:
        return None
    try:
        return signal.Signals[f"SIG{name}"]
    except KeyError:
        return None  # preemption_config() reports an unknown name when the Trainer starts


def _record(signum: int, frame: FrameType | None) -> None:
    _arrived.add(signum)


def hold(environ: Mapping[str, str]) -> None:
    """Record the job's warning signal from now on instead of dying of it, where nobody else handles it
    (it is ignored or has its default action). Python runs handlers in the main thread only."""
    sig = held_signal(environ)
    if sig is None or threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(sig)
    if current in (signal.SIG_DFL, signal.SIG_IGN):
        _before[sig] = current
        signal.signal(sig, _record)


def handed_over(sig: int, previous: Any) -> tuple[Any, bool]:
    """For a handler that has just replaced `previous` for `sig`: the handler to put back when it is
    removed (the one from before hold(), not the recorder), and whether `sig` arrived while held."""
    if previous is not _record:
        return previous, False
    arrived = sig in _arrived
    _arrived.discard(sig)
    return _before.pop(sig, signal.SIG_DFL), arrived
