"""requeue.py: which job to requeue and when, the job's end time, and `scontrol requeue` through a fake
runner or a SlurmClient (the commands and their parsing are SlurmClient's: tests/unit/jobs/test_slurm.py)."""

from __future__ import annotations

import subprocess
from datetime import datetime

import pytest
from tests.unit.train.conftest import Recorder

from torchslurm.errors import ConfigError, SlurmError
from torchslurm.jobs.slurm import SlurmClient
from torchslurm.runtime.distenv import DistEnv
from torchslurm.train.requeue import (
    RequeuePlan,
    job_end_time,
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


def test_a_slurm_client_is_taken_as_it_is() -> None:
    scontrol = Recorder(stdout=SCONTROL_JOB)
    client = SlurmClient(run=lambda argv, **kw: scontrol(argv, kw["timeout_s"]))
    assert job_end_time({"SLURM_JOB_ID": "57"}, client) == datetime(2026, 11, 25, 22, 41, 3).timestamp()
    requeue(RequeuePlan("57", "restart 1 of at most 3"), client)
    assert scontrol.calls == [["scontrol", "show", "job", "-o", "57"], ["scontrol", "requeue", "57"]]


def test_a_refusal_carries_its_fix_as_the_hint() -> None:
    with pytest.raises(SlurmError) as raised:
        requeue(RequeuePlan("9", "x"), Recorder(127, stderr="scontrol: No such file or directory"))
    assert raised.value.message == "`scontrol requeue 9` failed (127): scontrol: No such file or directory."
    assert raised.value.hint is not None and raised.value.hint.startswith("submit with --requeue")


def test_an_array_task_with_an_empty_job_id_is_no_job() -> None:
    assert requeue_target({"SLURM_JOB_ID": ""}) is None
    assert plan_requeue({"SLURM_JOB_ID": ""}, 3, wanted=True).target is None


def test_requeue_excluding_reads_the_job_requeues_then_excludes() -> None:
    from tests.unit.jobs.conftest import FakeRun, fixture

    from torchslurm.train.badnodes import NodeFault
    from torchslurm.train.requeue import requeue_excluding

    five = fixture("sinfo_nodes.txt") + "node5\tdebug*\t4\tgpu:4\t2000\n"
    run = FakeRun({"scontrol": (0, fixture("scontrol_excluded.txt"), ""), "sinfo": (0, five, "")})  # -N2, node[3-4] out
    fault = NodeFault("node2", 1, "rank 1 failed with an uncorrectable ECC error")
    line = requeue_excluding({"SLURM_JOB_ID": "31"}, [fault], 3, 4, SlurmClient(run=run))
    # ExcNodeList is taken only from a pending job: the update comes after the requeue
    assert [c[:3] for c in run.calls] == [["scontrol", "show", "job"], ["sinfo", "-h", "-N"],
                                          ["scontrol", "requeue", "31"], ["scontrol", "update", "JobId=31"]]
    assert run.calls[-1][-1] == "ExcNodeList=node[3-4,2]"
    assert line == ("excluded node2 from the next attempt: rank 1 failed with an uncorrectable ECC error "
                    "(job 31, restart 1 of at most 3)")
    # on the 4 nodes of the sandbox, node[3-4] and node1 out would leave 1 node for a 2-node job: kept
    run = FakeRun({"scontrol": (0, fixture("scontrol_excluded.txt"), "")})
    line = requeue_excluding({"SLURM_JOB_ID": "31"}, [NodeFault("node1", 0, "rank 0 failed with x")], 3, 4,
                             SlurmClient(run=run))
    assert [c[:2] for c in run.calls][-1] == ["scontrol", "requeue"] and line.startswith("kept node1 although")
    assert requeue_excluding({"SLURM_JOB_ID": "31", "SLURM_RESTART_COUNT": "3"}, [fault], 3, 4, run) == \
        "excluded no node (rank 1 failed with an uncorrectable ECC error): not requeued, SLURM_RESTART_COUNT=3 " \
        "has reached max_requeues=3"


class _Timed:
    """A SlurmClient runner that records each command with its timeout and answers from a table."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers, self.calls = answers, []  # type: dict[str, tuple[int, str, str]], list[tuple[str, float]]
        self.argvs: list[list[str]] = []

    def __call__(self, argv: list[str], timeout_s: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
        self.calls.append((" ".join(argv[:2]), timeout_s))
        self.argvs.append(list(argv))
        return subprocess.CompletedProcess(argv, *self.answers.get(" ".join(argv[:2]), self.answers.get(argv[0])))


def test_requeue_waits_60_s_for_scontrol_unless_told() -> None:
    timed = _Timed({"scontrol": (0, "", "")})
    requeue(RequeuePlan("5", "x"), SlurmClient(run=timed))
    requeue(RequeuePlan("5", "x"), SlurmClient(run=timed), timeout_s=10.0)
    assert timed.calls == [("scontrol requeue", 60.0), ("scontrol requeue", 10.0)]


def test_a_bad_end_time_is_refused_with_an_example_an_hour_from_now(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchslurm.train import requeue as module

    monkeypatch.setattr(module.time, "time", lambda: 1000.5)
    with pytest.raises(ConfigError) as raised:
        job_end_time({"TORCHSLURM_END_TIME": "soon"})
    assert str(raised.value) == ("TORCHSLURM_END_TIME='soon' is not unix seconds. HINT: e.g. "
                                 "TORCHSLURM_END_TIME=4600, or unset it.")


def test_no_deadline_from_slurm_is_a_warning_naming_why(caplog: pytest.LogCaptureFixture) -> None:
    assert job_end_time({"SLURM_JOB_ID": "57"}, Recorder(1, stderr="Invalid job id specified")) is None
    assert caplog.messages == ["no deadline: job 57 is unknown to Slurm: Invalid job id specified. HINT: it may have "
                               "finished more than MinJobAge ago (`scontrol show config | grep MinJobAge`); its log "
                               "files are still on disk."]


def test_the_reasons_of_a_plan_in_full() -> None:
    assert plan_requeue({"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": ""}, 3, wanted=True).reason == (
        "restart 1 of at most 3")  # empty: no restart yet
    assert plan_requeue({"SLURM_JOB_ID": "5"}, 3, wanted=False).reason == (
        "stopped by SIGTERM (scancel, time limit or Slurm's own preemption): Slurm decides whether the job comes back")
    with pytest.raises(ConfigError) as raised:
        plan_requeue({"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "x"}, 3, wanted=True)
    assert raised.value.hint == "Slurm sets it; unset it when running outside Slurm."


def test_requeue_excluding_asks_slurm_within_its_timeout_and_in_the_jobs_partitions() -> None:
    from tests.unit.jobs.conftest import fixture

    from torchslurm.train.badnodes import NodeFault
    from torchslurm.train.requeue import requeue_excluding

    job = fixture("scontrol_excluded.txt").replace("Partition=debug", "Partition=debug,long")
    five = fixture("sinfo_nodes.txt") + "node5\tdebug*\t4\tgpu:4\t2000\n"
    timed = _Timed({"scontrol": (0, job, ""), "sinfo": (0, five, "")})
    faults = [NodeFault("node2", 1, "rank 1 failed: ECC"), NodeFault("node1", 0, "rank 0 failed: ECC")]
    requeue_excluding({"SLURM_JOB_ID": "31"}, faults, 3, 4, SlurmClient(run=timed))
    assert timed.calls == [("scontrol show", 5.0), ("sinfo -h", 60), ("scontrol requeue", 5.0),
                           ("scontrol update", 5.0)]
    assert timed.argvs[1][-2:] == ["-p", "debug,long"]
    kept = _Timed({"scontrol": (0, job, ""), "sinfo": (0, five, "")})
    line = requeue_excluding({"SLURM_JOB_ID": "31"}, faults[:1], 3, 0, SlurmClient(run=kept))
    assert [c for c, _ in kept.calls] == ["scontrol show", "sinfo -h", "scontrol requeue"] and "kept node2" in line
    no_sinfo = _Timed({"scontrol": (0, job, ""), "sinfo": (1, "", "sinfo: error: Unable to contact slurm controller")})
    requeue_excluding({"SLURM_JOB_ID": "31"}, faults[:1], 3, 4, SlurmClient(run=no_sinfo))  # the job's list alone
    assert requeue_excluding({"SLURM_JOB_ID": "31", "SLURM_RESTART_COUNT": "3"}, faults, 3, 4, timed) == (
        "excluded no node (rank 1 failed: ECC, rank 0 failed: ECC): not requeued, SLURM_RESTART_COUNT=3 has reached "
        "max_requeues=3")


def test_a_requeue_refused_before_excluding_is_a_debug_line_and_the_nodes_are_still_excluded(
        caplog: pytest.LogCaptureFixture) -> None:
    """A peer rank requeued first: Slurm refuses the second requeue, the job pends all the same."""
    from tests.unit.jobs.conftest import fixture

    from torchslurm.train.badnodes import NodeFault
    from torchslurm.train.requeue import requeue_excluding

    five = fixture("sinfo_nodes.txt") + "node5\tdebug*\t4\tgpu:4\t2000\n"
    timed = _Timed({"scontrol": (0, fixture("scontrol_excluded.txt"), ""), "sinfo": (0, five, ""),
                    "scontrol requeue": (1, "", "Job is pending execution")})
    with caplog.at_level("DEBUG", logger="torchslurm.train.requeue"):
        requeue_excluding({"SLURM_JOB_ID": "31"}, [NodeFault("node2", 1, "x")], 3, 4, SlurmClient(run=timed))
    assert timed.calls[-1][0] == "scontrol update"
    assert [m for m in caplog.messages if m.startswith("requeue before")] == [
        "requeue before excluding nodes: `scontrol requeue 31` failed (1): Job is pending execution. HINT: submit "
        "with --requeue (torchslurm does when preemptible: true), and check that JobRequeue is not 0 in slurm.conf; "
        "the checkpoint is saved, so resubmitting resumes."]


def test_requeue_excluding_says_which_job_and_node_it_could_not_read() -> None:
    from torchslurm.train.badnodes import NodeFault
    from torchslurm.train.requeue import requeue_excluding

    failing = _Timed({"scontrol": (1, "", "slurm_load_jobs error: Unable to contact slurm controller")})
    faults = [NodeFault("node2", 1, "x"), NodeFault("node1", 0, "y")]
    with pytest.raises(SlurmError) as raised:
        requeue_excluding({"SLURM_JOB_ID": "31"}, faults, 3, 4, SlurmClient(run=failing))
    assert raised.value.message == ("cannot read job 31's nodes to exclude node2: scontrol show job 31 failed (1): "
                                    "slurm_load_jobs error: Unable to contact slurm controller.")
    assert raised.value.hint is not None and raised.value.hint != ""


def test_a_runner_is_handed_the_timeout_of_each_command() -> None:
    waited: list[float] = []

    def runner(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        waited.append(timeout_s)
        return subprocess.CompletedProcess(argv, 0, "", "")

    requeue(RequeuePlan("5", "x"), runner, timeout_s=7.0)
    assert waited == [7.0]
