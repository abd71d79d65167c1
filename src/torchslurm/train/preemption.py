"""Preemption and time limits: a signal or the job's deadline becomes a clean stop.

    stop = Preemption(preemption_config(os.environ))
    with stop:                                         # installs the signal handlers
        result = Trainer(..., should_stop=stop.should_stop).fit()
    if result.stopped_early:
        sys.exit(stop.finish())                        # rank 0 requeues; every rank exits 75

1. The handler of the warning signal (the job spec's `--signal`, USR2 by default) and of SIGTERM
   only records the signal: no I/O and no collectives in a handler.
2. `should_stop()` runs on every rank at each optimizer-step boundary. About every
   check_period_s (0.2 s; every step when steps are slower) the ranks start one all_reduce(MAX)
   of the four flags (warning signal, SIGTERM, deadline, Ctrl-C) and of the steps until the next check;
   it runs in the background and is read at the next check, so all ranks stop after the same
   step within about 0.4 s of the signal, and the host never waits for it (on CUDA a per-step sync
   would drain the GPU's queue). Blocking on every step cost 15 % of a 10 ms step here.
3. The Trainer then checkpoints (rank 0 writes, every rank waits) and returns.
4. `finish()`: rank 0 runs `scontrol requeue` (JOBID_TASKID for array tasks) unless
   SLURM_RESTART_COUNT has reached max_requeues; after a barrier every rank gets
   PREEMPTED_EXIT_CODE, and ignores SIGTERM from then on (the requeue's).

Ctrl-C (SIGINT) is a request to stop too: at the next step boundary, after a checkpoint, with
INTERRUPTED_EXIT_CODE (130) and no traceback and no requeue. Its handler gives SIGINT back to the
previous handler at once, so a second Ctrl-C raises KeyboardInterrupt: it stops at once. SIGINT is
taken only while Python's own KeyboardInterrupt handler has it (a handler of yours stays).

Requeue follows the warning signal and the deadline only. SIGTERM means scancel (the user wants
the job gone), the time limit itself (too late) or Slurm's own preemption (Slurm requeues by
itself): the ranks checkpoint inside KillWait and exit, but do not requeue.

Why USR2 (docs/slurm.md): neither torch nor a Gloo group installs a handler for it (/proc/self/status
SigCgt), c10's FatalSignalHandler only on request, and USR1 clashes with NCCL.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import FrameType, TracebackType
from typing import Any

from torchslurm.errors import ConfigError, SlurmError, below_minimum, not_one_of
from torchslurm.exitcodes import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE
from torchslurm.jobs.slurm import SlurmClient, run_command_status
from torchslurm.jobs.spec import SIGNALS
from torchslurm.runtime import startsignals
from torchslurm.runtime.launch import mark_finished
from torchslurm.train.badnodes import DEFAULT_MAX_EXCLUDED_NODES, NodeFault
from torchslurm.train.requeue import Runner, job_end_time, plan_requeue, requeue, requeue_excluding, slurm_client
from torchslurm.train.stopagreement import NO_STOP, Agreement, StopRequest, check_interval

logger = logging.getLogger(__name__)

DEFAULT_SIGNAL = "USR2"
DEFAULT_MAX_REQUEUES = 3
DEFAULT_GRACE_S = 120.0
DEFAULT_CHECK_PERIOD_S = 0.2

@dataclass(frozen=True)
class PreemptionConfig:
    """When to stop and what to do afterwards; `preemption_config(environ)` fills it from a job."""

    signal: str = DEFAULT_SIGNAL
    """The warning signal (`--signal` of the job spec) without the SIG prefix; SIGTERM is always handled."""
    max_requeues: int = DEFAULT_MAX_REQUEUES
    """Rank 0 requeues only while SLURM_RESTART_COUNT is below this; 0 never requeues."""
    max_excluded_nodes: int = DEFAULT_MAX_EXCLUDED_NODES
    """A node-level failure (train.badnodes) adds its node to the requeued job's ExcNodeList while that
    holds at most this many nodes; 0 never excludes."""
    grace_s: float = DEFAULT_GRACE_S
    """Stop this many seconds before end_time (the fallback when the warning signal does not come)."""
    end_time: float | None = None
    """Unix time at which Slurm ends the job (its time limit); None: no deadline."""
    check_every: int = 1
    """Agree on stopping at most every N optimizer steps (each check is one background all_reduce)."""
    check_period_s: float = DEFAULT_CHECK_PERIOD_S
    """Aim at one check per this many seconds: on short steps the ranks agree to check only every
    few steps (at least check_every), so that the checks cost nothing; 0 checks every check_every."""

    def __post_init__(self) -> None:
        name = self.signal.upper().removeprefix("SIG")
        object.__setattr__(self, "signal", name)
        ConfigError.raise_any([
            None if name in SIGNALS else
            not_one_of("signal", self.signal, SIGNALS, hint=f"{DEFAULT_SIGNAL} (the default; NCCL may catch USR1)."),
            None if self.max_requeues >= 0 else
            below_minimum("max_requeues", self.max_requeues, 0,
                          hint=f"0 disables requeue; the default is {DEFAULT_MAX_REQUEUES}."),
            None if self.max_excluded_nodes >= 0 else below_minimum("max_excluded_nodes", self.max_excluded_nodes, 0),
            None if self.grace_s >= 0 else
            below_minimum("grace_s", self.grace_s, 0, hint="give the seconds a checkpoint needs before the "
                          f"time limit, e.g. {DEFAULT_GRACE_S:g}."),
            None if self.check_every >= 1 else below_minimum("check_every", self.check_every, 1),
            None if 0 <= self.check_period_s <= 60 else
            ConfigError(f"check_period_s={self.check_period_s:g}, expected 0 to 60 seconds.",
                        f"{DEFAULT_CHECK_PERIOD_S:g} (the default), or 0 to check every check_every steps."),
        ])

    @property
    def deadline(self) -> float | None:
        """Unix time after which a step boundary stops the run (end_time - grace_s)."""
        return None if self.end_time is None else self.end_time - self.grace_s


def preemption_config(environ: Mapping[str, str], run: Runner | SlurmClient | None = None,
                      **overrides: Any) -> PreemptionConfig:
    """The config of this job from its environment.

    TORCHSLURM_PREEMPT_SIGNAL, TORCHSLURM_MAX_REQUEUES and TORCHSLURM_GRACE_S come from the
    generated sbatch script, TORCHSLURM_MAX_EXCLUDED_NODES (default 4), TORCHSLURM_CHECK_EVERY and
    TORCHSLURM_CHECK_PERIOD_S (how often the ranks agree) from you; the end time from
    TORCHSLURM_END_TIME (unix seconds, an override), SLURM_JOB_END_TIME, or — when `run` is given —
    `scontrol show job`'s EndTime. Only rank 0 needs a deadline (the all_reduce spreads its decision),
    so pass `run` on rank 0 only.
    """
    values: dict[str, Any] = {
        "signal": environ.get("TORCHSLURM_PREEMPT_SIGNAL", DEFAULT_SIGNAL),
        "max_requeues": _number(environ, "TORCHSLURM_MAX_REQUEUES", DEFAULT_MAX_REQUEUES, int),
        "grace_s": _number(environ, "TORCHSLURM_GRACE_S", DEFAULT_GRACE_S, float),
        "max_excluded_nodes": _number(environ, "TORCHSLURM_MAX_EXCLUDED_NODES", DEFAULT_MAX_EXCLUDED_NODES, int),
        "check_every": _number(environ, "TORCHSLURM_CHECK_EVERY", 1, int),
        "check_period_s": _number(environ, "TORCHSLURM_CHECK_PERIOD_S", DEFAULT_CHECK_PERIOD_S, float),
        "end_time": job_end_time(environ, run),
    }
    values.update(overrides)
    return PreemptionConfig(**values)


def _number(environ: Mapping[str, str], name: str, default: Any, kind: Callable[[str], Any]) -> Any:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number.", f"e.g. {name}={default}, or unset it.") from None


class Preemption:
    """Signal handlers, step-boundary agreement and the requeue for one training run."""

    def __init__(self, config: PreemptionConfig | None = None, *, environ: Mapping[str, str] | None = None,
                 run: Runner | SlurmClient = run_command_status, clock: Callable[[], float] = time.time,
                 ask_deadline: bool = False) -> None:
        """`run`: how Slurm commands run (a Runner, or a SlurmClient). `ask_deadline`: when the config
        has no end_time, ask Slurm for it (`scontrol show job`) as the handlers are installed; one
        rank asking is enough."""
        self.config = config or PreemptionConfig()
        self.environ = os.environ if environ is None else environ
        self._slurm, self._clock = slurm_client(run), clock
        self._ask_deadline = ask_deadline
        self._received: set[int] = set()
        self._previous: dict[int, Any] = {}
        self._steps = 0
        self._next_check = self.config.check_every
        self._every = self.config.check_every
        self._last_check: tuple[int, float] | None = None
        self._pending: Agreement | None = None
        self.request = NO_STOP

    @property
    def signals(self) -> tuple[signal.Signals, ...]:
        """The signals that ask for a stop: the warning signal, SIGTERM and SIGINT (see install)."""
        warning = signal.Signals[f"SIG{self.config.signal}"]
        return tuple(dict.fromkeys((warning, signal.SIGTERM, signal.SIGINT)))

    def install(self) -> None:
        """Install the handlers; the previous ones come back on uninstall(). Python runs signal
        handlers in the main thread only: elsewhere only the deadline can stop the run."""
        if self._ask_deadline and self.config.end_time is None:
            self.config = replace(self.config, end_time=job_end_time(self.environ, self._slurm))
            self._ask_deadline = False
        if threading.current_thread() is not threading.main_thread():
            logger.warning("not in the main thread: %s not caught; only the job's deadline stops this run early",
                           ", ".join(s.name for s in self.signals))
            return
        for sig in self.signals:
            if sig == signal.SIGINT and signal.getsignal(sig) is not signal.default_int_handler:
                continue  # ignored (e.g. a background job) or someone else's: leave SIGINT alone
            self._previous[sig], arrived = startsignals.handed_over(sig, signal.signal(sig, self._handle))
            if arrived:  # during start-up, while torchslurm.init() held it
                self._received.add(sig)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def __enter__(self) -> Preemption:
        self.install()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.uninstall()
        if exc_type is None:
            self._agreed()  # after an error the peers may be gone: leave it
            if not self.request.stop:  # the run is done: a signal from now on stops nothing
                mark_finished(self.environ, _rank())

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._received.add(signum)  # only record it: the step boundary does the rest
        if signum == signal.SIGINT and signum in self._previous:
            # The next Ctrl-C goes to the previous handler (KeyboardInterrupt): it stops at once.
            signal.signal(signum, self._previous.pop(signum))

    def local_request(self) -> StopRequest:
        """This rank's view, without talking to the others."""
        deadline = self.config.deadline
        return StopRequest(
            warning=signal.Signals[f"SIG{self.config.signal}"] in self._received,
            terminate=signal.SIGTERM in self._received and self.config.signal != "TERM",
            deadline=deadline is not None and self._clock() >= deadline,
            interrupt=signal.SIGINT in self._received,
        )

    def should_stop(self) -> bool:
        """The Trainer's hook, called on every rank at each optimizer-step boundary: True on all
        ranks, after the same step, once any rank has a reason to stop. With peers the answer
        comes one check later (see Agreement): a reason seen at one check stops every rank at
        the next, about check_period_s later (at least check_every steps)."""
        self._steps += 1
        if self.request.stop:
            return True
        if self._steps < self._next_check:
            return False
        latest = Agreement(self.local_request(), self._proposed_interval())
        if latest.ready:
            agreed, self._every = latest.result()[0], self.config.check_every  # no peers: checks are free
        else:
            (agreed, self._every), self._pending = self._agreed(), latest
        self._next_check = self._steps + self._every
        if agreed.stop:
            self.request = agreed | self._agreed()[0]  # every rank started `latest`: collect it too
            if _rank() == 0:  # every rank agreed on the same request: said once
                logger.info("stopping at this step boundary: %s", self._said())
        return self.request.stop

    def _proposed_interval(self) -> int:
        """This rank's proposal for the steps until the next check, from its recent step time."""
        now, last = time.monotonic(), self._last_check
        step_s = None if last is None else (now - last[1]) / (self._steps - last[0])  # checks are steps apart
        self._last_check = (self._steps, now)
        return check_interval(step_s, self.config.check_period_s, self.config.check_every)

    def _said(self) -> str:
        return self.request.describe(self.config.signal, self.config.grace_s)

    def _agreed(self) -> tuple[StopRequest, int]:
        """Wait for the agreement still running (all ranks started it): its answer."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else (NO_STOP, self._every)

    def finish(self, rank: int | None = None) -> int:
        """After the checkpoint: rank 0 requeues (within budget), all ranks wait for it, and the
        exit code for every rank is returned: INTERRUPTED_EXIT_CODE after Ctrl-C (never requeued:
        the user asked to stop), else PREEMPTED_EXIT_CODE."""
        rank = _rank() if rank is None else rank
        if rank == 0:
            plan = plan_requeue(self.environ, self.config.max_requeues, self.request.wants_requeue)
            try:
                requeue(plan, self._slurm)
                logger.info("stopped on %s; %s", self._said(),
                            f"requeued job {plan.target} ({plan.reason})" if plan.target else
                            f"not requeued: {plan.reason}")
            except SlurmError as exc:
                logger.error("%s", exc)
        _barrier()
        # on its way out: the requeue's SIGTERM must not cut the teardown short (srun: `Terminated`, not 75)
        if signal.SIGTERM in self._previous:  # handlers installed: uninstall() puts this one in place
            self._previous[signal.SIGTERM] = signal.SIG_IGN
        elif threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return INTERRUPTED_EXIT_CODE if self.request.interrupt else PREEMPTED_EXIT_CODE

    def requeue_after_failure(self) -> None:
        """After a peer died (no checkpoint is possible now): requeue within the budget so the job
        resumes from its last checkpoint. Meant for one rank per node (whoever still runs); Slurm
        refuses the second requeue of the same job, which is logged at debug level only."""
        plan = plan_requeue(self.environ, self.config.max_requeues, wanted=True)
        try:
            requeue(plan, self._slurm, timeout_s=10.0)  # bounded: the ranks must exit soon
        except SlurmError as exc:
            logger.debug("requeue after a peer failure: %s", exc)
            return
        logger.info("%s", f"requeued job {plan.target} after a peer failure ({plan.reason})" if plan.target
                    else f"not requeued after a peer failure: {plan.reason}")

    def exclude_after_failure(self, faults: Sequence[NodeFault]) -> None:
        """After a node-level failure (the watchdog's on_node_fault): requeue the job with those nodes
        excluded, as far as train.badnodes.plan_exclusion allows, and say so in the log."""
        try:
            logger.warning("%s", requeue_excluding(self.environ, faults, self.config.max_requeues,
                                                   self.config.max_excluded_nodes, self._slurm))
        except SlurmError as exc:
            logger.error("could not exclude %s from the next attempt: %s", faults[0].node, exc)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
