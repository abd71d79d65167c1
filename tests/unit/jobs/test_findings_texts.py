"""findings.validate(): every finding's whole text, message and hint, with its fields named as spec-file
keys and as command-line flags, and the bounds each rule starts at."""

from __future__ import annotations

from typing import Any

import pytest

from torchslurm.jobs.findings import log_dir_missing, validate
from torchslurm.jobs.spec import JobSpec, field_names
from torchslurm.jobs.spelling import command_line

FLAGS = command_line(field_names())
Said = tuple[str, str, str, str]


def said(fields: dict[str, Any], version: str | None = None, flags: bool = False) -> list[Said]:
    spec = JobSpec(script="t.py", **fields)
    found = validate(spec, version, FLAGS) if flags else validate(spec, version)
    return [(f.severity, f.code, f.message, f.hint) for f in found]


TORCHRUN = {"gpus_per_node": 4, "launch": "torchrun", "nproc_per_node": 2, "tasks_per_node": 2}


@pytest.mark.parametrize(("fields", "version", "keys", "flags"), [
    ({"gpus_per_node": 4, "tasks_per_node": 1}, None, [(
        "error", "tasks-vs-gpus", "launch=srun runs one rank per Slurm task, but tasks_per_node=1 and gpus_per_node=4.",
        "set tasks_per_node: 4, or use launch: torchrun with tasks_per_node: 1.")], [(
        "error", "tasks-vs-gpus",
        "--launch=srun runs one rank per Slurm task, but --tasks-per-node=1 and --gpus-per-node=4.",
        "set --tasks-per-node 4, or use --launch torchrun with --tasks-per-node 1.")]),
    (TORCHRUN, None, [
        ("error", "torchrun-tasks", "launch=torchrun with tasks_per_node=2: every task would start its own torchrun "
         "agent and the ranks would be counted several times.",
         "set tasks_per_node: 1 (torchrun starts nproc_per_node workers itself)."),
        ("error", "nproc-vs-gpus", "launch=torchrun with nproc_per_node=2 but gpus_per_node=4.",
         "set nproc_per_node: 4 (one worker per GPU)."),
        ("warning", "torchrun-cpus", "launch=torchrun runs 2 workers inside one Slurm task, which gets 1 CPU unless "
         "cpus_per_task is set.", "set cpus_per_task: 2 (or more, for data loading workers).")], [
        ("error", "torchrun-tasks", "--launch=torchrun with --tasks-per-node=2: every task would start its own "
         "torchrun agent and the ranks would be counted several times.",
         "set --tasks-per-node 1 (torchrun starts --nproc-per-node workers itself)."),
        ("error", "nproc-vs-gpus", "--launch=torchrun with --nproc-per-node=2 but --gpus-per-node=4.",
         "set --nproc-per-node 4 (one worker per GPU)."),
        ("warning", "torchrun-cpus", "--launch=torchrun runs 2 workers inside one Slurm task, which gets 1 CPU unless "
         "--cpus-per-task is set.", "set --cpus-per-task 2 (or more, for data loading workers).")]),
    ({"backend": "nccl"}, None, [(
        "error", "nccl-without-gpu", "backend=nccl but gpus_per_node=0: NCCL needs CUDA GPUs.",
        "use backend: gloo (or auto) for a CPU job, or request GPUs with gpus_per_node.")], [(
        "error", "nccl-without-gpu", "--backend=nccl but --gpus-per-node=0: NCCL needs CUDA GPUs.",
        "use --backend gloo (or auto) for a CPU job, or request GPUs with --gpus-per-node.")]),
    ({"gpus_per_node": 2, "backend": "gloo", "nic": "ib0"}, None, [
        ("warning", "gloo-with-gpu", "backend=gloo with gpus_per_node=2: gradients go through CPU memory, much slower "
         "than NCCL.", "use backend: auto (NCCL on GPUs)."),
        ("warning", "nic-override", "nic='ib0' sets the same interface name on every node; nodes with other NIC names "
         "fail with `Unable to find address for`.",
         "leave nic unset: torchslurm picks the interface reaching the master per node.")], [
        ("warning", "gloo-with-gpu", "--backend=gloo with --gpus-per-node=2: gradients go through CPU memory, much "
         "slower than NCCL.", "use --backend auto (NCCL on GPUs)."),
        ("warning", "nic-override", "--nic='ib0' sets the same interface name on every node; nodes with other NIC "
         "names fail with `Unable to find address for`.",
         "leave --nic unset: torchslurm picks the interface reaching the master per node.")]),
    ({"preemptible": True, "time": "2", "grace_s": 300}, None, [(
        "error", "grace-vs-time", "grace_s=300 is not shorter than time='2' (120 s): the warning signal would come "
        "before the job starts working.", "set grace_s below 120 (e.g. 12), or a longer time.")], [(
        "error", "grace-vs-time", "--grace-s=300 is not shorter than --time='2' (120 s): the warning signal would come "
        "before the job starts working.", "set --grace-s below 120 (e.g. 12), or a longer --time.")]),
    ({"preemptible": True, "grace_s": 30, "requeue": False}, None, [
        ("warning", "signal-without-time", "preemptible without a time limit: Slurm sends the warning signal only "
         "before the time limit, so only scancel/preemption will stop the job cleanly.",
         "set time (e.g. time: 4:00:00)."),
        ("warning", "no-requeue", "preemptible with requeue=false: after the checkpoint the job ends instead of "
         "continuing.", "set requeue: true."),
        ("warning", "short-grace", "grace_s=30: Slurm's signal timer has a 60 s resolution, and the checkpoint must "
         "fit in the remaining time.", "set grace_s to 60 or more.")], [
        ("warning", "signal-without-time", "preemptible without a time limit: Slurm sends the warning signal only "
         "before the time limit, so only scancel/preemption will stop the job cleanly.",
         "set --time (e.g. --time 4:00:00)."),
        ("warning", "no-requeue", "preemptible with --no-requeue: after the checkpoint the job ends instead of "
         "continuing.", "set --requeue."),
        ("warning", "short-grace", "--grace-s=30: Slurm's signal timer has a 60 s resolution, and the checkpoint must "
         "fit in the remaining time.", "set --grace-s to 60 or more.")]),
    ({"gpus_per_node": 2}, "slurm 18.08.9", [(
        "error", "gpu-flag", "gpu_flag=gpus-per-node but Slurm 18.08 predates --gpus-per-node (19.05).",
        "set gpu_flag: gres (renders --gres=gpu:N).")], [(
        "error", "gpu-flag", "--gpu-flag=gpus-per-node but Slurm 18.08 predates --gpus-per-node (19.05).",
        "set --gpu-flag gres (renders --gres=gpu:N).")]),
    ({"gpus_per_node": 2, "gpu_flag": "gres"}, "22.05", [(
        "info", "gpu-flag", "gpu_flag=gres on Slurm 22.05: --gres=gpu:N works, --gpus-per-node also does and sets "
        "SLURM_GPUS_PER_NODE.", "keep it, or set gpu_flag: gpus-per-node.")], [(
        "info", "gpu-flag", "--gpu-flag=gres on Slurm 22.05: --gres=gpu:N works, --gpus-per-node also does and sets "
        "SLURM_GPUS_PER_NODE.", "keep it, or set --gpu-flag gpus-per-node.")]),
    ({"time": "0"}, None, [(
        "info", "time-read-as", "time=0 means no time limit: Slurm reads 0 as UNLIMITED (the partition's MaxTime "
        "still applies).", "give the limit you mean, e.g. time: 4:00:00")], [(
        "info", "time-read-as", "--time=0 means no time limit: Slurm reads 0 as UNLIMITED (the partition's MaxTime "
        "still applies).", "give the limit you mean, e.g. --time 4:00:00")]),
    ({"time": "1:60:00"}, None, [(
        "info", "time-read-as", "time=1:60:00 is read as hours:minutes:seconds, with the overflow carried: a limit of "
        "2:00:00.", "write time: 2:00:00 if that is what you mean")], [(
        "info", "time-read-as", "--time=1:60:00 is read as hours:minutes:seconds, with the overflow carried: a limit "
        "of 2:00:00.", "write --time 2:00:00 if that is what you mean")]),
    ({"nodes": 2, "gpus_per_node": 4, "batch_size": 32, "lr": 0.1}, None, [(
        "info", "effective-batch", "effective batch size = 32 per rank x 8 ranks = 256 (2 node(s) x 4 rank(s)); "
        "lr=0.1 was tuned for which batch size?", "linear scaling from a single rank gives lr=0.8 (square-root "
        "scaling: 0.282843); warm up when scaling by a lot.")], [(
        "info", "effective-batch", "effective batch size = 32 per rank x 8 ranks = 256 (2 node(s) x 4 rank(s)); "
        "--lr=0.1 was tuned for which batch size?", "linear scaling from a single rank gives --lr=0.8 (square-root "
        "scaling: 0.282843); warm up when scaling by a lot.")]),
    ({"nodes": 2, "gpus_per_node": 4, "batch_size": 32}, None, [(
        "info", "effective-batch", "effective batch size = 32 per rank x 8 ranks = 256 (2 node(s) x 4 rank(s)).",
        "gradients are averaged over all ranks, so each step sees the effective batch.")], [(
        "info", "effective-batch", "effective batch size = 32 per rank x 8 ranks = 256 (2 node(s) x 4 rank(s)).",
        "gradients are averaged over all ranks, so each step sees the effective batch.")]),
])
def test_every_finding_whole_in_keys_and_in_flags(fields: dict[str, Any], version: str | None, keys: list[Said],
                                                  flags: list[Said]) -> None:
    assert said(fields, version) == keys
    assert said(fields, version, flags=True) == flags


@pytest.mark.parametrize(("fields", "codes"), [
    ({"gpus_per_node": 1, "tasks_per_node": 2}, ["tasks-vs-gpus"]),  # one GPU is a GPU job too
    ({"gpus_per_node": 1, "launch": "torchrun", "nproc_per_node": 2, "cpus_per_task": 2}, ["nproc-vs-gpus"]),
    ({"gpus_per_node": 1, "backend": "gloo"}, ["gloo-with-gpu"]),
    ({"preemptible": True, "time": "0:01", "grace_s": 60}, ["grace-vs-time"]),  # the shortest limit there is
    ({"backend": "gloo"}, []),  # gloo is the CPU job's backend
    ({"preemptible": True, "time": "10", "grace_s": 59}, ["short-grace"]),
    ({"preemptible": True, "time": "10", "grace_s": 60}, []),
    ({"preemptible": True, "time": "1", "grace_s": 60}, ["grace-vs-time"]),
    ({"preemptible": True, "time": "1:01", "grace_s": 60}, []),
])
def test_each_rule_starts_at_its_bound(fields: dict[str, Any], codes: list[str]) -> None:
    assert [code for _, code, _, _ in said(fields)] == codes


@pytest.mark.parametrize(("gpus", "gpu_flag", "version", "severities"), [
    (1, "gpus-per-node", "18.08", ["error"]),  # one GPU is asked for with the flag too
    (2, "gpus-per-node", "19.05", []),  # the first Slurm with --gpus-per-node
    (2, "gres", "19.05", ["info"]),
    (2, "gres", "18.08", []),
])
def test_slurm_19_05_is_the_first_with_gpus_per_node(gpus: int, gpu_flag: str, version: str,
                                                     severities: list[str]) -> None:
    found = said({"gpus_per_node": gpus, "gpu_flag": gpu_flag}, version)
    assert [(severity, code) for severity, code, _, _ in found] == [(s, "gpu-flag") for s in severities]


@pytest.mark.parametrize(("time", "grace", "hint"), [
    ("0:10", 60, "set grace_s below 10 (e.g. 1), or a longer time."),  # never 0 s
    ("0:19", 60, "set grace_s below 19 (e.g. 1), or a longer time."),
    ("1", 60, "set grace_s below 60 (e.g. 6), or a longer time."),
])
def test_the_grace_suggested_is_a_tenth_of_the_time_limit_and_at_least_a_second(time: str, grace: int,
                                                                                hint: str) -> None:
    (found,) = said({"preemptible": True, "time": time, "grace_s": grace})
    assert found[3] == hint


@pytest.mark.parametrize(("time", "read"), [
    ("1:60", "minutes:seconds, with the overflow carried: a limit of 0:02:00"),
    ("1:00:60", "hours:minutes:seconds, with the overflow carried: a limit of 1:01:00"),
    ("0-24", "days-hours:minutes:seconds, with the overflow carried: a limit of 1-00:00:00"),
    ("1-24", "days-hours:minutes:seconds, with the overflow carried: a limit of 2-00:00:00"),
    ("1-23:60", "days-hours:minutes:seconds, with the overflow carried: a limit of 2-00:00:00"),
    ("1-23:59:60", "days-hours:minutes:seconds, with the overflow carried: a limit of 2-00:00:00"),
    ("23:60:00", "hours:minutes:seconds, with the overflow carried: a limit of 1-00:00:00"),  # a whole day: in days
])
def test_a_field_at_its_range_carries_over(time: str, read: str) -> None:
    (found,) = said({"time": time})
    assert found[2] == f"time={time} is read as {read}."


@pytest.mark.parametrize("time", ["1-23", "1-23:59", "0-23:59:59", "59", "1:59", "1:59:59", "100:59"])
def test_a_field_just_inside_its_range_is_not_noted(time: str) -> None:
    assert said({"time": time}) == []


def test_a_missing_log_folder_is_a_warning_with_the_mkdir_that_makes_it() -> None:
    found = log_dir_missing("output", "logs dir/%j.out", "logs dir")
    assert (found.severity, found.code, found.message, found.hint) == (
        "warning", "log-dir", "--output=logs dir/%j.out: Slurm does not create logs dir/; if it is missing the job "
        "fails before printing anything.", "mkdir -p 'logs dir' before sbatch.")
