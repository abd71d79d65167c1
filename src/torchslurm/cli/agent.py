"""`python -m torchslurm.cli.agent [torchrun options] script [args…]`: torchrun's agent (torch's own
`torch.distributed.run`, the same options), as the torchrun-mode job scripts run it on each node, with
an end that fits a job which stops on request.

Within a job step slurmstepd signals every process of the step, so the agent gets the same SIGTERM
as its workers: from scancel, the time limit, Slurm's preemption, or the requeue rank 0 asks for
after a stop. torchrun takes it as the order to end its workers: it sends them the signal again,
waits 30 s (`--shutdown-timeout`) and kills them, a second SIGTERM cuts that wait short, and it exits
1 with a `SignalException: Process … got signal: 15` traceback, which srun follows with
`error: … Exited with exit code 1`: a crash, to anyone reading the log, after a stop that saved its
checkpoint. Here the first SIGTERM ends the agent in the same way, but later ones are ignored (the
workers are saving), the wait is the job's grace period (TORCHSLURM_GRACE_S) and the agent exits
quietly with PREEMPTED_EXIT_CODE, which is what its workers exit with after a stop. Workers that all
stopped on request end the agent with their code, without torch's failure report; any other failure
is reported as torchrun reports it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType
from typing import Any

from torchslurm.cli.ending import exit_process
from torchslurm.exitcodes import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE
from torchslurm.runtime.launch import signal_exit_code

GRACE_VARIABLE = "TORCHSLURM_GRACE_S"
"""The job's grace period, exported by preemptible job scripts: how long the workers may take to stop."""
HANDLED_HERE = "SIGTERM"
"""The signal the agent handles itself (TermHandler); torch's agent keeps its handlers of the others."""


def stopped_code(exitcodes: Iterable[int]) -> int | None:
    """The agent's exit code when every failed worker stopped on request (after a stop the Trainer
    exits 75, after Ctrl-C 130): theirs, else None (a real failure, reported by torch)."""
    codes = set(exitcodes)
    return max(codes) if codes and codes <= {PREEMPTED_EXIT_CODE, INTERRUPTED_EXIT_CODE} else None


def settings(args: Any, environ: Mapping[str, str]) -> None:
    """torchrun's parsed options, changed for a job: SIGTERM left to TermHandler, and the workers given
    the grace period to stop. torch versions without these options keep their own behaviour."""
    if isinstance(getattr(args, "signals_to_handle", None), str):
        names = [name.strip() for name in args.signals_to_handle.split(",")]
        args.signals_to_handle = ",".join(name for name in names if name and name != HANDLED_HERE)
    grace = environ.get(GRACE_VARIABLE, "")
    if hasattr(args, "shutdown_timeout") and args.shutdown_timeout is None and grace.isdigit():
        args.shutdown_timeout = max(int(grace), 30)  # never shorter than torch's own 30 s


class TermHandler:
    """SIGTERM in the agent: the first one, while the agent runs, ends it as torch's own handler
    would (SignalException: the workers get SIGTERM and `shutdown_timeout` to exit); any later one is
    ignored, so that the wait for the workers goes on."""

    def __init__(self, signal_exception: Callable[[str, signal.Signals], BaseException]) -> None:
        self._exception = signal_exception
        self.running = True
        self.received: signal.Signals | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None or not self.running:
            return
        self.received = signal.Signals(signum)
        # what the agent logs next is its shutdown ("Received 15 death signal", "Sending process …
        # closing signal"): the expected course of a stop. torch sets a level on each of its loggers.
        for name in list(logging.Logger.manager.loggerDict):
            if name.startswith("torch.distributed.elastic"):
                logging.getLogger(name).setLevel(logging.ERROR)
        raise self._exception(f"Process {os.getpid()} got signal: {self.received}", self.received)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(list(sys.argv[1:] if argv is None else argv))  # type: ignore[no-untyped-call]
    settings(args, environ)
    handler = TermHandler(SignalException)
    signal.signal(signal.SIGTERM, handler)
    try:
        torchrun.run(args)  # type: ignore[no-untyped-call]
    except SignalException as exc:
        return signal_exit_code(exc.sigval)
    except ChildFailedError as exc:
        code = stopped_code(failure.exitcode for failure in exc.failures.values())
        if code is None:
            raise  # torchrun's own report: the first failure, its exit code and error file
        return code
    finally:
        handler.running = False
    return 0


if __name__ == "__main__":  # a torchrun-mode job's agent: `python -m torchslurm.cli.agent`
    exit_process(main())
