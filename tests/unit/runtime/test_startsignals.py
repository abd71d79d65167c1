"""The job's warning signal during start-up: held by a handler that records it, handed over to the
Trainer's handler with what arrived, and the handler from before put back afterwards."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from torchslurm.runtime import startsignals
from torchslurm.train.preemption import Preemption, PreemptionConfig


@pytest.fixture
def usr1_restored() -> Iterator[None]:
    before = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, before)


@pytest.mark.parametrize(("value", "held"), [
    ("USR2", signal.SIGUSR2), ("sigusr1", signal.SIGUSR1), ("URG", signal.SIGURG),
    ("TERM", None), ("INT", None), ("HUP", None), ("", None), ("BOGUS", None),
])
def test_the_held_signal_is_the_jobs_warning_unless_it_means_end_now(value: str, held: signal.Signals | None) -> None:
    assert startsignals.held_signal({startsignals.WARNING_VARIABLE: value}) == held
    assert startsignals.held_signal({}) is None


def test_a_warning_during_start_up_is_recorded_and_the_preemption_handler_takes_it_over(usr1_restored: None) -> None:
    """A real signal, sent while held: the process lives on, and the Trainer's Preemption sees it as a stop."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # as the job script's `trap ""` starts a rank
    startsignals.hold({startsignals.WARNING_VARIABLE: "USR1"})
    os.kill(os.getpid(), signal.SIGUSR1)
    stop = Preemption(PreemptionConfig(signal="USR1"), environ={})
    with stop:
        assert stop.local_request().warning
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN  # what was there before hold(), not the recorder


def test_nothing_arrived_is_no_stop_and_a_handler_of_someone_else_is_left_alone(usr1_restored: None) -> None:
    def theirs(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    startsignals.hold({startsignals.WARNING_VARIABLE: "USR1"})
    stop = Preemption(PreemptionConfig(signal="USR1"), environ={})
    with stop:
        assert not stop.local_request().warning
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    signal.signal(signal.SIGUSR1, theirs)
    startsignals.hold({startsignals.WARNING_VARIABLE: "USR1"})
    assert signal.getsignal(signal.SIGUSR1) is theirs
