"""findings.validate(): the job specs Slurm accepts but that go wrong, each rule on plain specs,
the order findings are reported in, and how their messages name fields (keys or flags)."""

from __future__ import annotations

import pytest

from torchslurm.jobs.findings import SEVERITIES, Finding, by_severity, validate
from torchslurm.jobs.spec import JobSpec
from torchslurm.jobs.spelling import command_line


def codes(spec: JobSpec, version: str | None = None) -> dict[str, str]:
    return {f.code: f.severity for f in validate(spec, version)}


def test_defaults_srun_gpu_layout() -> None:
    spec = JobSpec(script="train.py", nodes=2, gpus_per_node=4)
    assert (spec.slurm_tasks_per_node, spec.ranks_per_node, spec.world_size) == (4, 4, 8)
    assert codes(spec) == {}


def test_defaults_torchrun_layout() -> None:
    spec = JobSpec(script="train.py", nodes=2, gpus_per_node=8, launch="torchrun", cpus_per_task=32)
    assert (spec.slurm_tasks_per_node, spec.ranks_per_node, spec.world_size) == (1, 8, 16)
    assert codes(spec) == {}


def test_srun_tasks_vs_gpus_error() -> None:
    found = validate(JobSpec(script="t.py", nodes=4, gpus_per_node=4, tasks_per_node=1))
    assert found[0].code == "tasks-vs-gpus" and found[0].severity == "error"
    assert "set tasks_per_node: 4, or use launch: torchrun" in found[0].hint


def test_torchrun_nproc_vs_gpus_and_tasks() -> None:
    spec = JobSpec(script="t.py", gpus_per_node=4, launch="torchrun", nproc_per_node=2, tasks_per_node=4,
                   cpus_per_task=8)
    assert codes(spec) == {"torchrun-tasks": "error", "nproc-vs-gpus": "error"}


def test_torchrun_cpus_warning() -> None:
    assert codes(JobSpec(script="t.py", launch="torchrun", nproc_per_node=2)) == {"torchrun-cpus": "warning"}


def test_cpu_job_with_nccl() -> None:
    assert codes(JobSpec(script="t.py", backend="nccl")) == {"nccl-without-gpu": "error"}


def test_preemption_grace_longer_than_time() -> None:
    spec = JobSpec(script="t.py", preemptible=True, time="2", grace_s=300)
    found = validate(spec)
    assert found[0].code == "grace-vs-time"
    assert "grace_s=300 is not shorter than time='2' (120 s)" in found[0].message


def test_preemption_without_time_and_requeue() -> None:
    spec = JobSpec(script="t.py", preemptible=True, requeue=False, grace_s=30)
    assert codes(spec) == {
        "signal-without-time": "warning", "no-requeue": "warning", "short-grace": "warning"}


def test_gpu_flag_by_version() -> None:
    spec = JobSpec(script="t.py", gpus_per_node=2)
    assert codes(spec, "slurm 18.08.9") == {"gpu-flag": "error"}
    assert codes(spec, "slurm-wlm 22.05.8") == {}
    assert codes(JobSpec(script="t.py", gpus_per_node=2, gpu_flag="gres"), "22.05") == {"gpu-flag": "info"}
    assert codes(spec, None) == {}  # no version given: nothing to compare with
    assert codes(JobSpec(script="t.py", gpu_flag="gres"), "18.08") == {}  # a CPU job asks for no GPUs


def test_effective_batch_summary_and_lr_scaling() -> None:
    spec = JobSpec(script="t.py", nodes=6, gpus_per_node=1, batch_size=64, lr=0.01)
    (found,) = validate(spec)
    assert "effective batch size = 64 per rank x 6 ranks = 384" in found.message
    assert found.message.endswith("; lr=0.01 was tuned for which batch size?")  # one mark, not "?."
    assert "lr=0.06" in found.hint
    (plain,) = validate(JobSpec(script="t.py", nodes=6, gpus_per_node=1, batch_size=64))
    assert plain.message.endswith("(6 node(s) x 1 rank(s)).")


def test_nic_override_warns() -> None:
    assert codes(JobSpec(script="t.py", nic="eth0")) == {"nic-override": "warning"}


def test_errors_sorted_first() -> None:
    spec = JobSpec(script="t.py", nic="eth0", backend="nccl")
    assert [f.severity for f in validate(spec)] == ["error", "warning"]


def test_grace_shorter_than_the_time_limit_is_fine_and_unlimited_time_is_not_compared() -> None:
    assert codes(JobSpec(script="t.py", preemptible=True, time="10", grace_s=120)) == {}
    assert "grace-vs-time" not in codes(JobSpec(script="t.py", preemptible=True, time="0", grace_s=120))


def test_preemption_rules_only_for_a_preemptible_job() -> None:
    assert codes(JobSpec(script="t.py", requeue=False, grace_s=30)) == {}


def test_gloo_with_gpus_is_a_warning_and_nccl_with_gpus_is_fine() -> None:
    assert codes(JobSpec(script="t.py", gpus_per_node=2, backend="gloo")) == {"gloo-with-gpu": "warning"}
    assert codes(JobSpec(script="t.py", gpus_per_node=2, backend="nccl")) == {}


def test_torchrun_with_one_worker_needs_no_extra_cpus() -> None:
    assert codes(JobSpec(script="t.py", launch="torchrun")) == {}


def test_severity_order_is_error_warning_info_and_stable_within_one() -> None:
    def finding(severity: str, code: str) -> Finding:
        return Finding(severity, code, "m", "h")  # type: ignore[arg-type]

    found = [finding("info", "i1"), finding("warning", "w1"), finding("error", "e1"), finding("warning", "w2"),
             finding("error", "e2")]
    assert [f.code for f in by_severity(found)] == ["e1", "e2", "w1", "w2", "i1"]
    assert SEVERITIES == ("error", "warning", "info")


def test_validate_reports_errors_then_warnings_then_the_summary() -> None:
    spec = JobSpec(script="t.py", nic="eth0", backend="nccl", batch_size=8, preemptible=True, time="60")
    assert [(f.severity, f.code) for f in validate(spec)] == [
        ("error", "nccl-without-gpu"), ("warning", "nic-override"), ("info", "effective-batch")]


def test_a_finding_reads_severity_code_message_then_hint() -> None:
    assert str(Finding("warning", "x", "what is wrong.", "the fix.")) == "warning: [x] what is wrong. HINT: the fix."


@pytest.mark.parametrize(("flags", "message", "hint"), [
    (set(), "launch=srun runs one rank per Slurm task, but tasks_per_node=1 and gpus_per_node=4.",
     "set tasks_per_node: 4, or use launch: torchrun with tasks_per_node: 1."),
    ({"launch", "tasks_per_node", "gpus_per_node"},
     "--launch=srun runs one rank per Slurm task, but --tasks-per-node=1 and --gpus-per-node=4.",
     "set --tasks-per-node 4, or use --launch torchrun with --tasks-per-node 1."),
    ({"tasks_per_node"}, "launch=srun runs one rank per Slurm task, but --tasks-per-node=1 and gpus_per_node=4.",
     "set --tasks-per-node 4, or use launch: torchrun with --tasks-per-node 1."),
])
def test_messages_name_each_field_as_it_was_given(flags: set[str], message: str, hint: str) -> None:
    (found,) = validate(JobSpec(script="t.py", gpus_per_node=4, tasks_per_node=1), spelling=command_line(flags))
    assert (found.message, found.hint) == (message, hint)


def test_booleans_are_named_as_their_flag_or_as_true_false() -> None:
    spec = JobSpec(script="t.py", preemptible=True, requeue=False, time="60")
    (keys,) = [f for f in validate(spec) if f.code == "no-requeue"]
    (flags,) = [f for f in validate(spec, spelling=command_line({"requeue"})) if f.code == "no-requeue"]
    assert (keys.message.split(":")[0], keys.hint) == ("preemptible with requeue=false", "set requeue: true.")
    assert (flags.message.split(":")[0], flags.hint) == ("preemptible with --no-requeue", "set --requeue.")


@pytest.mark.parametrize(("time", "said"), [
    ("99:99", "time=99:99 is read as minutes:seconds, with the overflow carried: a limit of 1:41:00"),
    ("1:75:00", "time=1:75:00 is read as hours:minutes:seconds, with the overflow carried: a limit of 2:15:00"),
    ("1-30", "time=1-30 is read as days-hours:minutes:seconds, with the overflow carried: a limit of 2-06:00:00"),
    ("0", "time=0 means no time limit: Slurm reads 0 as UNLIMITED"),
])
def test_a_time_slurm_reads_other_than_it_looks_is_said_as_read(time: str, said: str) -> None:
    (found,) = [f for f in validate(JobSpec(script="t.py", time=time)) if f.code == "time-read-as"]
    assert found.severity == "info" and found.message.startswith(said)
    flags = validate(JobSpec(script="t.py", time=time), spelling=command_line({"time"}))
    assert next(f.message for f in flags if f.code == "time-read-as").startswith("--" + said)


@pytest.mark.parametrize("time", ["30:00", "1:00:00", "90", "100:00:00", "1-00:00:00", "2-23:59:59", "59:59"])
def test_a_time_written_in_range_gets_no_note(time: str) -> None:
    assert "time-read-as" not in codes(JobSpec(script="t.py", time=time))
