"""How the ranks agree to stop after the same step: each rank's reasons to stop (a StopRequest), one
all_reduce(MAX) of them started at one check and read at the next (Agreement), and the steps between
two checks (check_interval). train.preemption decides when to check and what a stop leads to.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_CHECK_EVERY = 1000


@dataclass(frozen=True)
class StopRequest:
    """What the ranks agreed on at a step boundary."""

    warning: bool
    """Some rank received the warning signal."""
    terminate: bool
    """Some rank received SIGTERM."""
    deadline: bool
    """Some rank passed the deadline (end_time - grace_s)."""
    interrupt: bool = False
    """Some rank got Ctrl-C (SIGINT)."""

    @property
    def stop(self) -> bool:
        return self.warning or self.terminate or self.deadline or self.interrupt

    @property
    def wants_requeue(self) -> bool:
        return (self.warning or self.deadline) and not self.interrupt

    def __or__(self, other: StopRequest) -> StopRequest:
        return StopRequest(self.warning or other.warning, self.terminate or other.terminate,
                           self.deadline or other.deadline, self.interrupt or other.interrupt)

    def describe(self, warning_signal: str, grace_s: float) -> str:
        """The reasons in words: `SIGUSR2 and SIGTERM`, `the deadline (60 s before the time limit)`."""
        parts = [f"SIG{warning_signal}"] if self.warning else []
        parts += ["SIGTERM"] if self.terminate else []
        parts += [f"the deadline ({grace_s:g} s before the time limit)"] if self.deadline else []
        parts += ["Ctrl-C (SIGINT)"] if self.interrupt else []
        return " and ".join(parts) or "nothing"


NO_STOP = StopRequest(False, False, False)


def check_interval(step_s: float | None, period_s: float, minimum: int) -> int:
    """Steps between two agreements: about period_s worth of steps of step_s seconds, at least
    `minimum`, at most MAX_CHECK_EVERY; `minimum` while the step time is unknown or period_s is 0."""
    if step_s is None or period_s <= 0:
        return minimum
    wanted = int(period_s / step_s) if step_s > 0 else MAX_CHECK_EVERY
    return max(minimum, min(wanted, MAX_CHECK_EVERY))


class Agreement:
    """All ranks' requests OR-ed, and the steps until the next check (the largest proposal), in one
    all_reduce(MAX) of five integers, started at one check and read at the next, so that it runs
    while training goes on instead of stalling a step (on CUDA the host then waits for an event
    behind it, not for the whole queue). Without a process group: this rank's values, at once."""

    def __init__(self, mine: StopRequest, interval: int) -> None:
        import torch
        import torch.distributed as dist

        self._mine: tuple[StopRequest, int] | None = (mine, interval)
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        self._mine = None
        cuda = dist.get_backend() == "nccl"
        values = [mine.warning, mine.terminate, mine.deadline, mine.interrupt, interval]
        flags = torch.tensor(values, dtype=torch.int32)  # on CUDA, copied from pinned memory: no stream drained
        self._flags = flags.pin_memory().to(torch.cuda.current_device(), non_blocking=True) if cuda else flags
        self._work = dist.all_reduce(self._flags, op=dist.ReduceOp.MAX, async_op=True)
        self._copied: torch.cuda.Event | None = None
        if cuda:
            self._work.wait()  # NCCL: the stream waits for the all_reduce, the host does not
            host = torch.empty(len(values), dtype=torch.int32, pin_memory=True)
            host.copy_(self._flags, non_blocking=True)
            self._flags, self._copied = host, torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._copied.record()

    @property
    def ready(self) -> bool:
        """True without peers: the answer needs no waiting."""
        return self._mine is not None

    def result(self) -> tuple[StopRequest, int]:
        """(the agreed request, the agreed steps until the next check)."""
        if self._mine is not None:
            return self._mine
        if self._copied is not None:
            self._copied.synchronize()
        else:
            self._work.wait()
        warning, terminate, deadline, interrupt, interval = self._flags.tolist()
        return StopRequest(bool(warning), bool(terminate), bool(deadline), bool(interrupt)), int(interval)
