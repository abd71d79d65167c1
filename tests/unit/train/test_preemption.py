"""Pure decisions of preemption.py, and the handlers in this (single) process."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from tests.unit.train.conftest import Recorder
from tests.unit.train.fakepeers import Peers

from torchslurm.errors import ConfigError
from torchslurm.exitcodes import INTERRUPTED_EXIT_CODE
from torchslurm.runtime.launch import FINISHED_VARIABLE
from torchslurm.train.preemption import PREEMPTED_EXIT_CODE, Preemption, PreemptionConfig, preemption_config
from torchslurm.train.stopagreement import StopRequest


@pytest.fixture(autouse=True)
def sigterm_kept() -> Iterator[None]:
    """finish() leaves SIGTERM ignored (a rank on its way out): this process gets its own back."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def send(stop: Preemption, sig: signal.Signals) -> None:
    """A real signal to this process, once `stop`'s handler is seen to have it: without the handler the signal
    would end this process, pytest and all, instead of failing the test."""
    assert signal.getsignal(sig) == stop._handle, f"{sig.name} is not caught"
    os.kill(os.getpid(), sig)


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


def test_a_bad_signal_or_requeue_budget_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"signal='KILL' is not one of USR1, USR2, TERM, INT, HUP, URG\. HINT: USR2"):
        PreemptionConfig(signal="KILL")
    with pytest.raises(ConfigError, match=r"TORCHSLURM_MAX_REQUEUES='three' is not a number"):
        preemption_config({"TORCHSLURM_MAX_REQUEUES": "three"})
    with pytest.raises(ConfigError, match=r"^max_requeues=-1 must be at least 0\. HINT: 0 disables requeue"):
        PreemptionConfig(max_requeues=-1)


def test_handler_only_records_and_boundary_stops() -> None:
    """A real signal to this process: the handler records it, the next boundary reports it."""
    before = signal.getsignal(signal.SIGUSR2)
    stop = Preemption(PreemptionConfig(), environ={})
    with stop:
        assert not stop.should_stop()
        send(stop, signal.SIGUSR2)
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
        send(stop, signal.SIGINT)
        assert stop.should_stop() and stop.request == StopRequest(False, False, False, interrupt=True)
        assert stop.request.describe("USR2", 60) == "Ctrl-C (SIGINT)" and not stop.request.wants_requeue
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
        send(stop, signal.SIGTERM)
        assert stop.should_stop()
    assert stop.finish(rank=0) == PREEMPTED_EXIT_CODE
    assert runner.calls == []


def test_after_finish_the_requeue_s_sigterm_no_longer_ends_the_rank() -> None:
    """finish() within the handlers' block (the Trainer) and after it (a loop of your own)."""
    for inside in (True, False):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        stop = Preemption(PreemptionConfig(), environ={"SLURM_JOB_ID": "8"}, run=Recorder())
        with stop:
            send(stop, signal.SIGUSR2)
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
        send(stop, signal.SIGUSR2)
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


# -- every setting's refusal, the logs, and the agreement with peers (a recording torch.distributed) ---------

def test_settings_at_their_bounds_are_taken_and_past_them_refused_in_full() -> None:
    PreemptionConfig(max_requeues=0, max_excluded_nodes=0, grace_s=0, check_period_s=60)
    for kwargs, text in [
        ({"max_excluded_nodes": -1}, "max_excluded_nodes=-1 must be at least 0. HINT: set max_excluded_nodes to 0 or "
                                     "more."),
        ({"grace_s": -1}, "grace_s=-1 must be at least 0. HINT: give the seconds a checkpoint needs before the time "
                          "limit, e.g. 120."),
        ({"check_period_s": 60.5}, "check_period_s=60.5, expected 0 to 60 seconds. HINT: 0.2 (the default), or 0 to "
                                   "check every check_every steps."),
    ]:
        with pytest.raises(ConfigError) as info:
            PreemptionConfig(**kwargs)  # type: ignore[arg-type]
        assert str(info.value) == text


def test_config_reads_the_node_exclusion_limit_and_asks_slurm_for_the_end_time() -> None:
    assert preemption_config({"TORCHSLURM_MAX_EXCLUDED_NODES": "2"}).max_excluded_nodes == 2
    with pytest.raises(ConfigError, match=r"^TORCHSLURM_MAX_EXCLUDED_NODES='1.5' is not a number\."):
        preemption_config({"TORCHSLURM_MAX_EXCLUDED_NODES": "1.5"})
    scontrol = Recorder(stdout="JobId=57 EndTime=2026-11-25T22:41:03")
    assert preemption_config({"SLURM_JOB_ID": "57"}, scontrol).end_time == datetime(2026, 11, 25, 22, 41, 3).timestamp()


def test_sigterm_as_the_warning_signal_is_the_warning() -> None:
    stop = Preemption(PreemptionConfig(signal="TERM"), environ={})
    with stop:
        send(stop, signal.SIGTERM)
        assert stop.should_stop()
    assert stop.request == StopRequest(True, False, False) and stop.request.wants_requeue


def test_preemption_reads_the_process_environment_by_default() -> None:
    assert Preemption(PreemptionConfig()).environ is os.environ


def test_finish_requeues_only_on_the_rank_it_is_told_is_0() -> None:
    runner = Recorder()
    stop = Preemption(PreemptionConfig(end_time=0.0, grace_s=0.0), environ={"SLURM_JOB_ID": "8"}, run=runner)
    assert stop.should_stop()
    assert stop.finish(rank=1) == PREEMPTED_EXIT_CODE and runner.calls == []


def test_the_requeue_after_a_peer_failure_waits_10_s_at_most() -> None:
    from torchslurm.jobs.slurm import SlurmClient

    waited: list[float] = []

    def run(argv: list[str], timeout_s: float = 0, **kw: object) -> subprocess.CompletedProcess[str]:
        waited.append(timeout_s)
        return subprocess.CompletedProcess(argv, 0, "", "")

    Preemption(PreemptionConfig(), environ={"SLURM_JOB_ID": "8"}, run=SlurmClient(run=run)).requeue_after_failure()
    assert waited == [10.0]


def test_the_warning_signal_keeps_its_handler_after_it_arrives() -> None:
    stop = Preemption(PreemptionConfig(), environ={})
    with stop:
        send(stop, signal.SIGUSR2)
        assert signal.getsignal(signal.SIGUSR2) == stop._handle  # only SIGINT hands over to the previous handler


def test_with_sigint_as_the_warning_signal_and_a_handler_of_the_users_sigterm_is_still_caught() -> None:
    def mine(signum: int, frame: object) -> None:
        pass

    before = signal.signal(signal.SIGINT, mine)
    try:
        stop = Preemption(PreemptionConfig(signal="INT"), environ={})
        with stop:
            assert signal.getsignal(signal.SIGINT) is mine and signal.getsignal(signal.SIGTERM) == stop._handle
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_warning_signal_that_came_during_start_up_stops_at_the_first_boundary() -> None:
    from torchslurm.runtime import startsignals

    before = signal.getsignal(signal.SIGUSR2)
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        startsignals.hold({startsignals.WARNING_VARIABLE: "USR2"})
        os.kill(os.getpid(), signal.SIGUSR2)  # recorded by torchslurm.init()'s holder
        stop = Preemption(PreemptionConfig(), environ={})
        with stop:
            assert stop.should_stop() and stop.request == StopRequest(True, False, False)
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL  # what was there before the holder
    finally:
        signal.signal(signal.SIGUSR2, before)


def test_a_deadline_slurm_could_not_tell_is_asked_for_once() -> None:
    scontrol = Recorder(stdout="JobId=57 EndTime=Unknown")
    stop = Preemption(PreemptionConfig(), environ={"SLURM_JOB_ID": "57"}, run=scontrol, ask_deadline=True)
    for _ in range(2):
        with stop:
            pass
    assert len(scontrol.calls) == 1 and stop.config.end_time is None


def test_outside_the_main_thread_the_warning_says_which_signals_are_not_caught(
        caplog: pytest.LogCaptureFixture) -> None:
    worker = threading.Thread(target=lambda: Preemption(PreemptionConfig(), environ={}).install())
    worker.start()
    worker.join()
    assert caplog.messages == ["not in the main thread: SIGUSR2, SIGTERM, SIGINT not caught; only the job's deadline "
                               "stops this run early"]


@pytest.mark.parametrize(("environ", "said"), [
    ({"SLURM_JOB_ID": "8"}, "requeued job 8 (restart 1 of at most 3)"),
    ({"SLURM_JOB_ID": "8", "SLURM_RESTART_COUNT": "3"}, "not requeued: SLURM_RESTART_COUNT=3 has reached "
                                                        "max_requeues=3"),
])
def test_finish_says_what_stopped_the_run_and_what_became_of_the_job(
        caplog: pytest.LogCaptureFixture, environ: dict[str, str], said: str) -> None:
    stop = Preemption(PreemptionConfig(end_time=0.0, grace_s=0.0), environ=environ, run=Recorder())
    with caplog.at_level("INFO", logger="torchslurm.train.preemption"):
        assert stop.should_stop()
        stop.finish()
    assert caplog.messages == ["stopping at this step boundary: the deadline (0 s before the time limit)",
                               f"stopped on the deadline (0 s before the time limit); {said}"]


def test_a_refused_requeue_is_logged_as_slurm_said_it(caplog: pytest.LogCaptureFixture) -> None:
    stop = Preemption(PreemptionConfig(end_time=0.0, grace_s=0.0), environ={"SLURM_JOB_ID": "8"},
                      run=Recorder(1, stderr="Job is not requeueable"))
    assert stop.should_stop()
    stop.finish(rank=0)
    (error,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert error.getMessage() == (
        "`scontrol requeue 8` failed (1): Job is not requeueable. HINT: submit with --requeue (torchslurm does when "
        "preemptible: true), and check that JobRequeue is not 0 in slurm.conf; the checkpoint is saved, so "
        "resubmitting resumes.")


def test_after_a_peer_failure_the_job_is_requeued_within_its_budget(caplog: pytest.LogCaptureFixture) -> None:
    runner = Recorder()
    with caplog.at_level("DEBUG", logger="torchslurm.train.preemption"):
        Preemption(PreemptionConfig(), environ={"SLURM_JOB_ID": "8"}, run=runner).requeue_after_failure()
        Preemption(PreemptionConfig(max_requeues=0), environ={"SLURM_JOB_ID": "9"}, run=runner).requeue_after_failure()
        Preemption(PreemptionConfig(), environ={"SLURM_JOB_ID": "10"},
                   run=Recorder(1, stderr="already requeued")).requeue_after_failure()
    assert runner.calls == [["scontrol", "requeue", "8"]]
    assert caplog.messages[:2] == [
        "requeued job 8 after a peer failure (restart 1 of at most 3)",
        "not requeued after a peer failure: SLURM_RESTART_COUNT=0 has reached max_requeues=0"]
    assert caplog.messages[2].startswith("requeue after a peer failure: `scontrol requeue 10` failed (1): already "
                                         "requeued.")
    assert [r.levelname for r in caplog.records] == ["INFO", "INFO", "DEBUG"]


def test_after_a_node_failure_the_job_is_requeued_without_the_node(caplog: pytest.LogCaptureFixture) -> None:
    from tests.unit.jobs.conftest import FakeRun, fixture

    from torchslurm.jobs.slurm import SlurmClient
    from torchslurm.train.badnodes import NodeFault

    fault = NodeFault("node2", 1, "rank 1 failed with an uncorrectable ECC error")
    five = fixture("sinfo_nodes.txt") + "node5\tdebug*\t4\tgpu:4\t2000\n"
    run = FakeRun({"scontrol": (0, fixture("scontrol_excluded.txt"), ""), "sinfo": (0, five, "")})
    config = PreemptionConfig(max_excluded_nodes=3)
    Preemption(config, environ={"SLURM_JOB_ID": "31"}, run=SlurmClient(run=run)).exclude_after_failure([fault])
    assert run.calls[-1][-1] == "ExcNodeList=node[3-4,2]"
    failing = FakeRun({"scontrol": (1, "", "slurm_load_jobs error: Unable to contact slurm controller")})
    Preemption(config, environ={"SLURM_JOB_ID": "31"}, run=SlurmClient(run=failing)).exclude_after_failure([fault])
    assert [r.levelname for r in caplog.records] == ["WARNING", "ERROR"]
    assert caplog.messages[0] == ("excluded node2 from the next attempt: rank 1 failed with an uncorrectable ECC error "
                                  "(job 31, restart 1 of at most 3)")
    assert caplog.messages[1].startswith("could not exclude node2 from the next attempt: cannot read job 31's nodes")
    only_two = FakeRun({"scontrol": (0, fixture("scontrol_excluded.txt"), ""), "sinfo": (0, five, "")})
    Preemption(PreemptionConfig(max_excluded_nodes=2), environ={"SLURM_JOB_ID": "31"},
               run=SlurmClient(run=only_two)).exclude_after_failure([fault])
    assert [c[:2] for c in only_two.calls][-1] == ["scontrol", "requeue"]  # node[3-4] are out already: no third


def test_with_peers_a_stop_is_agreed_one_check_later_and_said_by_rank_0_only(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    for rank in (0, 1):
        peers = Peers(rank, [1, 0, 0, 0, 1])  # the peer got the warning signal
        peers.install(monkeypatch)
        stop = Preemption(PreemptionConfig(), environ={}, run=Recorder())
        with caplog.at_level("INFO", logger="torchslurm.train.preemption"):
            assert [stop.should_stop(), stop.should_stop()] == [False, True]
            assert stop.finish() == PREEMPTED_EXIT_CODE and peers.barriers == 1
        assert stop.request == StopRequest(True, False, False) and len(peers.reduced) == 2
    assert caplog.messages == ["stopping at this step boundary: SIGUSR2", "stopped on SIGUSR2; not requeued: not a "
                                                                          "Slurm job (no SLURM_JOB_ID): nothing to "
                                                                          "requeue"]


@pytest.mark.parametrize(("check_every", "times", "proposals"), [
    (1, [100.0, 100.015625, 100.046875], [1, 16, 8]),  # 1/64 s, then 1/32 s a step: 16 and 8 steps of 0.25 s
    (2, [100.0, 100.0625, 100.1875], [2, 8, 4]),  # checked every 2 steps: 1/32 s, then 1/16 s a step
])
def test_with_peers_each_rank_proposes_the_steps_that_make_the_check_period(
        monkeypatch: pytest.MonkeyPatch, check_every: int, times: list[float], proposals: list[int]) -> None:
    from torchslurm.train import preemption

    peers = Peers(0, [0, 0, 0, 0, 0])  # the peer proposes nothing larger
    peers.install(monkeypatch)
    clock, real, here = iter(times), preemption.time.monotonic, threading.get_ident()
    # time is the module every thread uses: a thread left running by another test reads the real clock
    monkeypatch.setattr(preemption.time, "monotonic", lambda: next(clock) if threading.get_ident() == here else real())
    stop = Preemption(PreemptionConfig(check_every=check_every, check_period_s=0.25), environ={})
    steps = 0
    while len(peers.reduced) < len(times):
        assert not stop.should_stop()
        steps += 1
    assert [flags[4] for flags, *_ in peers.reduced] == proposals
    assert steps == 3 * check_every  # the intervals agreed so far are those proposed before any step time was known
