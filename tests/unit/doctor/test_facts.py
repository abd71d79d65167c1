"""torchslurm.doctor.facts: the Report's JSON and text forms, checks made from errors, and the placement helpers."""

from __future__ import annotations

import json

import pytest

from torchslurm.doctor import facts
from torchslurm.doctor.facts import Check, Facts, Report
from torchslurm.errors import EnvError
from torchslurm.runtime import distenv

SRUN = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "node[1-2]"}
BATCH = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "4", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
         "SLURM_JOB_NODELIST": "node[1-2]"}
FAILED = Report("node2", 2, 4, "srun", (
    Check("placement", "ok", "srun task 2 of 4.", value="srun"),
    Check("gloo_socket_ifname", "error", "GLOO_SOCKET_IFNAME=eth0 does not exist on node2.", "unset it.", "eth0"),
))


def test_a_report_read_back_from_its_json_line_is_the_same_report() -> None:
    again = Report.from_json(json.loads(json.dumps(FAILED.to_json())))
    assert again == FAILED and again.failed and FAILED.to_json()["ok"] is False
    for not_a_report in ({"host": "n1"}, {"checks": 3}, [1, 2]):
        with pytest.raises((KeyError, TypeError)):
            Report.from_json(not_a_report)  # type: ignore[arg-type]


def test_the_json_spells_statuses_as_the_doctor_always_has() -> None:
    warned = Report("n1", None, None, None, (Check("torch", "warning", "torch is not installed."),))
    assert [c["status"] for c in FAILED.to_json()["checks"]] == ["ok", "fail"]
    assert warned.to_json()["checks"][0]["status"] == "warn" and warned.to_json()["ok"] is True
    with pytest.raises(KeyError):
        Report.from_json({**warned.to_json(), "checks": [{"name": "x", "status": "bad", "detail": ""}]})


def test_every_line_names_host_and_rank_when_several_ranks_print() -> None:
    many = Report("node2", 2, 4, "srun", tuple(Check(f"check_{i}", "ok", "x" * 100) for i in range(20)))
    text = facts.render(many)
    assert all(line.startswith("node2/2: ") for line in text.splitlines())
    assert text.splitlines()[-1] == "node2/2: 20 ok, 0 warning(s), 0 failure(s)"
    assert not facts.render(Report("node2", 0, 1, "srun", many.checks)).startswith("node2/")


def test_a_failure_shows_its_hint_under_it_and_every_status_its_mark() -> None:
    lines = facts.render(FAILED).splitlines()
    fail = next(i for i, line in enumerate(lines) if "FAIL  gloo_socket_ifname" in line)
    assert lines[fail + 1].strip().endswith("HINT: unset it.")
    assert lines[-1].endswith("1 ok, 0 warning(s), 1 failure(s)")
    warned = Report("n1", None, None, None, (Check("torch", "warning", "torch is not installed.", "install it."),))
    assert facts.render(warned).splitlines()[1:] == [
        "  WARN  torch  torch is not installed.", "               HINT: install it.",
        "0 ok, 1 warning(s), 0 failure(s)"]


def test_a_check_from_an_error_takes_its_message_and_hint_as_they_are() -> None:
    error = EnvError("MASTER_PORT=70000 is not a TCP port (1-65535).", "unset MASTER_PORT.")
    assert facts.from_error("master_port", error, "70000") == Check(
        "master_port", "error", "MASTER_PORT=70000 is not a TCP port (1-65535).", "unset MASTER_PORT.", "70000")
    assert facts.from_error("x", EnvError("no hint here.")).hint == ""


def test_placement_is_none_when_the_environment_contradicts_itself() -> None:
    assert facts.placement({**SRUN, "SLURM_PROCID": "9"}) is None
    env = facts.placement(SRUN)
    assert env is not None and env.launcher == "srun"


def test_a_batch_shell_checks_the_first_node_of_the_job_as_master() -> None:
    env = distenv.detect(BATCH, free_port=lambda: 0)
    assert facts.master_name(env, BATCH) == "node1" and facts.num_nodes(env, BATCH) == 2
    assert facts.master_name(env, {**BATCH, "MASTER_ADDR": "login1"}) == env.master_addr


def test_backend_flag_wins_over_the_variable() -> None:
    given = Facts(environ={"TORCHSLURM_BACKEND": "nccl"})
    assert facts.requested_backend(given, "gloo") == ("gloo", "--backend gloo")
    assert facts.requested_backend(given, None) == ("nccl", "TORCHSLURM_BACKEND=nccl")
    assert facts.requested_backend(Facts(environ={}), None) == (None, "")
