"""Pure decisions of preemption.py, and the handlers in this (single) process."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from datetime import datetime

import pytest

from torchslurm.errors import ConfigError, SlurmError
from torchslurm.runtime.distenv import DistEnv
from torchslurm.train.preemption import (
    MAX_CHECK_EVERY,
    PREEMPTED_EXIT_CODE,
    Preemption,
    PreemptionConfig,
    StopRequest,
    check_interval,
    preemption_config,
)
from torchslurm.train.requeue import (
    RequeuePlan,
    job_end_time,
    parse_end_time,
    plan_requeue,
    requeue,
    requeue_target,
    requeues_after_failure,
)

SCONTROL_JOB = (
    "JobId=57 JobName=train UserId=root(0) JobState=RUNNING Reason=None Requeue=1 Restarts=2 "
    "RunTime=00:00:12 TimeLimit=00:01:00 SubmitTime=2026-11-25T22:40:00 StartTime=2026-11-25T22:40:03 "
    "EndTime=2026-11-25T22:41:03 Deadline=N/A NodeList=node[1-2] NumNodes=2"
)


class Recorder:
    """A fake Slurm command runner: records argv, answers with a fixed result."""

    def __init__(self, returncode: int = 0, stdout: str = "", stderr: str = "") -> None:
        self.calls: list[list[str]] = []
        self.result = (returncode, stdout, stderr)

    def __call__(self, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        return subprocess.CompletedProcess(list(argv), *self.result)


def test_array_task_is_requeued_as_jobid_taskid() -> None:
    env = {"SLURM_JOB_ID": "1043", "SLURM_ARRAY_JOB_ID": "1040", "SLURM_ARRAY_TASK_ID": "3"}
    assert requeue_target(env) == "1040_3"
    assert requeue_target({"SLURM_JOB_ID": "77"}) == "77"
    assert requeue_target({}) is None


@pytest.mark.parametrize(("restarts", "target"), [(None, "77"), ("0", "77"), ("2", "77"), ("3", None), ("9", None)])
def test_requeue_budget_is_read_against_restart_count(restarts: str | None, target: str | None) -> None:
    env = {"SLURM_JOB_ID": "77"} | ({"SLURM_RESTART_COUNT": restarts} if restarts else {})
    plan = plan_requeue(env, max_requeues=3, wanted=True)
    assert plan.target == target
    if target is None:
        assert plan.reason == f"SLURM_RESTART_COUNT={restarts} has reached max_requeues=3"
    else:
        assert plan.reason == f"restart {int(restarts or 0) + 1} of at most 3"


def test_sigterm_stop_and_no_slurm_never_requeue() -> None:
    assert plan_requeue({"SLURM_JOB_ID": "5"}, 3, wanted=False).target is None
    assert "SIGTERM" in plan_requeue({"SLURM_JOB_ID": "5"}, 3, wanted=False).reason
    outside = RequeuePlan(None, "not a Slurm job (no SLURM_JOB_ID): nothing to requeue")
    assert plan_requeue({}, 3, wanted=True) == outside
    assert plan_requeue({"SLURM_JOB_ID": "5"}, 0, wanted=True).target is None


@pytest.mark.parametrize(("launcher", "local_rank", "restarts", "expected"), [
    ("srun", 0, (0, 0), True), ("srun", 1, (0, 0), False),
    ("torchrun", 0, (0, 1), False),  # the agents restart the workers
    ("torchrun", 0, (1, 1), True),   # they have no restarts left
    ("torchrun", 0, (0, 0), True), ("torchrun", 1, (0, 0), False), ("local", 0, (0, 0), False),
])
def test_who_requeues_after_a_peer_failure(launcher: str, local_rank: int, restarts: tuple[int, int],
                                           expected: bool) -> None:
    env = DistEnv(rank=2 + local_rank, local_rank=local_rank, world_size=4, local_world_size=2, node_rank=1,
                  num_nodes=2, master_addr="n1", master_port=1234, launcher=launcher, job_id="7", reason="",
                  restart_count=restarts[0], max_restarts=restarts[1])
    assert requeues_after_failure(env) is expected


def test_bad_restart_count_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"SLURM_RESTART_COUNT='x' is not a count"):
        plan_requeue({"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "x"}, 3, wanted=True)


def test_requeue_runs_scontrol_and_reports_refusal() -> None:
    ok = Recorder()
    requeue(RequeuePlan("1040_3", "restart 1 of at most 3"), ok)
    assert ok.calls == [["scontrol", "requeue", "1040_3"]]
    requeue(RequeuePlan(None, "budget"), ok)
    assert len(ok.calls) == 1
    refused = Recorder(1, stderr="scontrol_requeue error: Requested operation is presently disabled")
    expected = r"`scontrol requeue 9` failed \(1\): .*presently disabled\. HINT: .*--requeue"
    with pytest.raises(SlurmError, match=expected):
        requeue(RequeuePlan("9", "x"), refused)


def test_scontrol_ended_by_the_requeues_own_sigterm_counts_as_requeued() -> None:
    """Slurm stops the run at once when it accepts the requeue; scontrol may get that SIGTERM first."""
    requeue(RequeuePlan("17", "restart 1 of at most 3"), Recorder(-15))
    with pytest.raises(SlurmError, match=r"`scontrol requeue 17` failed \(-9\)"):
        requeue(RequeuePlan("17", "x"), Recorder(-9))


def test_end_time_sources_in_order() -> None:
    assert job_end_time({"TORCHSLURM_END_TIME": "100", "SLURM_JOB_END_TIME": "200"}) == 100.0
    assert job_end_time({"SLURM_JOB_END_TIME": "200", "SLURM_JOB_ID": "57"}, Recorder()) == 200.0
    scontrol = Recorder(stdout=SCONTROL_JOB)
    expected = datetime(2026, 11, 25, 22, 41, 3).timestamp()
    assert job_end_time({"SLURM_JOB_ID": "57"}, scontrol) == expected
    assert scontrol.calls == [["scontrol", "show", "job", "-o", "57"]]
    assert job_end_time({"SLURM_JOB_ID": "57"}) is None  # no runner: never asks slurmctld
    assert job_end_time({"SLURM_JOB_ID": "57"}, Recorder(1, stderr="Invalid job id")) is None
    with pytest.raises(ConfigError, match=r"SLURM_JOB_END_TIME='soon' is not unix seconds"):
        job_end_time({"SLURM_JOB_END_TIME": "soon"})


def test_parse_end_time_unknown() -> None:
    assert parse_end_time("JobId=1 EndTime=Unknown Deadline=N/A") is None
    assert parse_end_time("JobId=1") is None


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
    assert "not in the main thread: SIGUSR2 and SIGTERM not caught" in caplog.text


def test_sigterm_stops_without_requeue() -> None:
    runner = Recorder()
    stop = Preemption(PreemptionConfig(), environ={"SLURM_JOB_ID": "8"}, run=runner)
    with stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.should_stop()
    assert stop.finish(rank=0) == PREEMPTED_EXIT_CODE
    assert runner.calls == []


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
