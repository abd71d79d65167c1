"""Pure decisions of preemption.py, and the handlers in this (single) process."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from tests.unit.train.conftest import Recorder

from torchslurm.errors import ConfigError
from torchslurm.exitcodes import INTERRUPTED_EXIT_CODE
from torchslurm.runtime.launch import FINISHED_VARIABLE
from torchslurm.train.preemption import (
    MAX_CHECK_EVERY,
    PREEMPTED_EXIT_CODE,
    Preemption,
    PreemptionConfig,
    StopRequest,
    check_interval,
    preemption_config,
)


@pytest.fixture(autouse=True)
def sigterm_kept() -> Iterator[None]:
    """finish() leaves SIGTERM ignored (a rank on its way out): this process gets its own back."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_config_from_environ_and_validation() -> None:
    cfg = preemption_config({"TORCHSLURM_PREEMPT_SIGNAL": "SIGUSR1", "TORCHSLURM_MAX_REQUEUES": "5",
                             "TORCHSLURM_GRACE_S": "30", "SLURM_JOB_END_TIME": "1000"})
    assert (cfg.signal, cfg.max_requeues, cfg.grace_s, cfg.end_time, cfg.deadline) == ("USR1", 5, 30.0, 1000.0, 970.0)
    assert preemption_config({}) == PreemptionConfig()
    assert preemption_config({}, check_every=4).check_every == 4
    assert preemption_config({"TORCHSLURM_CHECK_EVERY": "10"}).check_every == 10
    with pytest.raises(ConfigError, match=r"^check_every=0 must be at least 1\. HINT: set check_every to 1 or more\.$"):
        preemption_config({"TORCHSLURM_CHECK_EVERY": "0"})
    assert preemption_config({"TORCHSLURM_CHECK_PERIOD_S": "0"}).check_period_s == 0
    with pytest.raises(ConfigError, match=r"TORCHSLURM_CHECK_EVERY='often' is not a number\. HINT"):
        preemption_config({"TORCHSLURM_CHECK_EVERY": "often"})
    with pytest.raises(ConfigError, match=r"check_period_s=-1, expected 0 to 60 seconds\. HINT: 0\.2"):
        preemption_config({"TORCHSLURM_CHECK_PERIOD_S": "-1"})


@pytest.mark.parametrize(("step_s", "period_s", "minimum", "expected"), [
    (None, 0.2, 1, 1),       # step time not known yet
    (0.01, 0.2, 1, 20),      # 10 ms steps: one check per 20 steps
    (0.5, 0.2, 1, 1),        # slow steps: every step
    (0.01, 0.2, 50, 50),     # never below check_every
    (0.01, 0.0, 3, 3),       # period 0: every check_every steps
    (0.0, 0.2, 1, MAX_CHECK_EVERY), (1e-6, 0.2, 1, MAX_CHECK_EVERY),
])
def test_check_interval_aims_at_the_period(step_s: float | None, period_s: float, minimum: int,
                                           expected: int) -> None:
    assert check_interval(step_s, period_s, minimum) == expected
    with pytest.raises(ConfigError, match=r"signal='KILL' is not one of USR1, USR2, TERM, INT, HUP, URG\. HINT: USR2"):
        PreemptionConfig(signal="KILL")
    with pytest.raises(ConfigError, match=r"TORCHSLURM_MAX_REQUEUES='three' is not a number"):
        preemption_config({"TORCHSLURM_MAX_REQUEUES": "three"})
    with pytest.raises(ConfigError, match=r"^max_requeues=-1 must be at least 0\. HINT: 0 disables requeue"):
        PreemptionConfig(max_requeues=-1)


def test_stop_request_reasons() -> None:
    cfg = PreemptionConfig(grace_s=60)
    assert not StopRequest(False, False, False).stop
    assert StopRequest(True, True, False).describe(cfg) == "SIGUSR2 and SIGTERM"
    assert StopRequest(False, False, True).describe(cfg) == "the deadline (60 s before the time limit)"
    assert StopRequest(False, True, False).stop and not StopRequest(False, True, False).wants_requeue
    assert StopRequest(False, False, True).wants_requeue


def test_handler_only_records_and_boundary_stops() -> None:
    """A real signal to this process: the handler records it, the next boundary reports it."""
    before = signal.getsignal(signal.SIGUSR2)
    stop = Preemption(PreemptionConfig(), environ={})
    with stop:
        assert not stop.should_stop()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert stop.should_stop()
        assert stop.request == StopRequest(True, False, False)
        assert stop.should_stop()  # stays stopped
    assert signal.getsignal(signal.SIGUSR2) is before


def test_outside_the_main_thread_no_handlers_but_the_deadline_still_stops(caplog: pytest.LogCaptureFixture) -> None:
    before = signal.getsignal(signal.SIGUSR2)
    stop = Preemption(PreemptionConfig(end_time=time.time() + 10, grace_s=60), environ={})
    seen: list[bool] = []

    def in_a_thread() -> None:
        with stop:
            seen.append(signal.getsignal(signal.SIGUSR2) is before)
            seen.append(stop.should_stop())

    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    assert seen == [True, True] and stop.request.deadline
    assert "not in the main thread: SIGUSR2, SIGTERM, SIGINT not caught" in caplog.text


@pytest.mark.usefixtures("terminal_sigint")  # a background pytest has SIGINT ignored: Preemption leaves it alone
def test_ctrl_c_stops_at_the_boundary_without_requeue_and_a_second_one_stops_at_once() -> None:
    """The first SIGINT (a real one, to this process) is only recorded: no KeyboardInterrupt; the
    boundary stops with exit code 130 and nothing is requeued. The second raises KeyboardInterrupt."""
    runner = Recorder()
    stop = Preemption(PreemptionConfig(), environ={"SLURM_JOB_ID": "7"}, run=runner)
    with stop:
        assert signal.getsignal(signal.SIGINT) == stop._handle
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.should_stop() and stop.request == StopRequest(False, False, False, interrupt=True)
        assert stop.request.describe(stop.config) == "Ctrl-C (SIGINT)" and not stop.request.wants_requeue
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # a signal to oneself is handled before kill returns
        assert stop.finish(rank=0) == INTERRUPTED_EXIT_CODE
    assert runner.calls == [] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_sigint_handler_of_the_users_is_left_alone() -> None:
    def mine(signum: int, frame: object) -> None:
        pass

    before = signal.signal(signal.SIGINT, mine)
    try:
        with Preemption(PreemptionConfig(), environ={}):
            assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)


def test_sigterm_stops_without_requeue() -> None:
    runner = Recorder()
    stop = Preemption(PreemptionConfig(), environ={"SLURM_JOB_ID": "8"}, run=runner)
    with stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.should_stop()
    assert stop.finish(rank=0) == PREEMPTED_EXIT_CODE
    assert runner.calls == []


def test_after_finish_the_requeue_s_sigterm_no_longer_ends_the_rank() -> None:
    """finish() within the handlers' block (the Trainer) and after it (a loop of your own)."""
    for inside in (True, False):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        stop = Preemption(PreemptionConfig(), environ={"SLURM_JOB_ID": "8"}, run=Recorder())
        with stop:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stop.should_stop()
            if inside:
                stop.finish(rank=0)
        if not inside:
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
            stop.finish(rank=0)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN, inside


def test_a_run_that_ends_without_a_stop_tells_the_launcher_it_finished(tmp_path: Path) -> None:
    """`torchslurm run` gives its ranks a folder (FINISHED_VARIABLE): a Ctrl-C after every rank left its
    file there is no stop to announce. A stopped run leaves none; nothing is written without the folder."""
    environ = {FINISHED_VARIABLE: str(tmp_path)}
    with Preemption(PreemptionConfig(), environ=environ):
        pass
    assert [p.name for p in tmp_path.iterdir()] == ["rank-0"]
    (tmp_path / "rank-0").unlink()
    with Preemption(PreemptionConfig(), environ=environ) as stop:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert stop.should_stop()
    with Preemption(PreemptionConfig(), environ={}):
        pass
    assert list(tmp_path.iterdir()) == []


def test_deadline_stops_and_requeues_with_check_every() -> None:
    now = [1000.0]
    runner = Recorder()
    cfg = PreemptionConfig(end_time=1100.0, grace_s=30.0, check_every=2)
    stop = Preemption(cfg, environ={"SLURM_JOB_ID": "8", "SLURM_RESTART_COUNT": "1"}, run=runner,
                      clock=lambda: now[0])
    assert [stop.should_stop(), stop.should_stop()] == [False, False]
    now[0] = 1070.0
    assert stop.should_stop() is False  # step 3: not a check step
    assert stop.should_stop() is True
    assert stop.finish(rank=0) == PREEMPTED_EXIT_CODE
    assert runner.calls == [["scontrol", "requeue", "8"]]


def test_refused_requeue_still_exits_preempted(caplog: pytest.LogCaptureFixture) -> None:
    stop = Preemption(PreemptionConfig(end_time=0.0, grace_s=0.0), environ={"SLURM_JOB_ID": "8"},
                      run=Recorder(1, stderr="Job is not requeueable"))
    assert stop.should_stop()
    assert stop.finish(rank=0) == PREEMPTED_EXIT_CODE
    assert "`scontrol requeue 8` failed (1): Job is not requeueable" in caplog.text


def test_rank_0_asks_slurm_for_the_deadline_once_when_installing() -> None:
    scontrol = Recorder(stdout="JobId=57 EndTime=2026-11-25T22:41:03")
    stop = Preemption(PreemptionConfig(grace_s=60), environ={"SLURM_JOB_ID": "57"}, run=scontrol, ask_deadline=True)
    assert scontrol.calls == []  # nothing asked at construction
    with stop:
        pass
    with stop:
        pass
    assert scontrol.calls == [["scontrol", "show", "job", "-o", "57"]]
    assert stop.config.deadline == datetime(2026, 11, 25, 22, 41, 3).timestamp() - 60


def test_a_known_end_time_is_not_asked_for() -> None:
    scontrol = Recorder()
    with Preemption(PreemptionConfig(end_time=100.0), environ={"SLURM_JOB_ID": "57"}, run=scontrol, ask_deadline=True):
        pass
    assert scontrol.calls == []
