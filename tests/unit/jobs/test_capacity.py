"""findings.capacity(): a job that asks more of the partition's nodes than they have never starts;
whole messages and hints, from the sandbox's four equal nodes and a partition of two kinds."""

from __future__ import annotations

import pytest

from torchslurm.jobs.findings import capacity
from torchslurm.jobs.slurmoutput import NodeInfo
from torchslurm.jobs.spec import JobSpec, field_names
from torchslurm.jobs.spelling import command_line

SANDBOX_NODES = [NodeInfo(f"node{i}", "debug", True, cpus=4, gpus=4, memory_mb=2000) for i in (1, 2, 3, 4)]
MIXED = [NodeInfo(f"small{i}", "gpu", True, cpus=16, gpus=2, memory_mb=64000) for i in (1, 2, 3)] + [
    NodeInfo(f"big{i}", "gpu", True, cpus=64, gpus=8, memory_mb=512000) for i in (1, 2)]
FLAGS = command_line(field_names())
SANDBOX = "node[1-4]: 4 CPUs, 4 GPUs, 2000 MB"
BOTH_KINDS = "big[1-2]: 64 CPUs, 8 GPUs, 512000 MB; small[1-3]: 16 CPUs, 2 GPUs, 64000 MB"
SINFO = ", or another partition (`sinfo -N -l` shows what each node has)"


def refusal(spec: JobSpec, nodes: list[NodeInfo], flags: bool = False) -> tuple[str, str]:
    (found,) = capacity(spec, nodes, FLAGS) if flags else capacity(spec, nodes)
    assert (found.severity, found.code) == ("error", "never-starts")
    return found.message, found.hint


def test_a_job_bigger_than_every_node_of_the_partition_never_starts() -> None:
    """8 GPUs x 8 CPUs per node against the sandbox's 4 x 4: Slurm would keep it pending for ever."""
    assert refusal(JobSpec(script="t.py", nodes=2, gpus_per_node=8, cpus_per_task=8), SANDBOX_NODES) == (
        "the job asks for 2 node(s) with 64 CPUs (8 task(s) x 8), 8 GPUs each, but only 0 node(s) of the default "
        f"partition have that ({SANDBOX}); Slurm would queue it and it would never start.",
        "ask for gpus_per_node: 4 (with as many tasks per node in srun mode)" + SINFO)
    _, hint = refusal(JobSpec(script="t.py", gpus_per_node=8), SANDBOX_NODES, flags=True)
    assert hint == "ask for --gpus-per-node 4 (with as many tasks per node in srun mode)" + SINFO


def test_as_many_gpus_as_a_node_has_but_too_many_cpus_is_said_as_the_cpus() -> None:
    spec = JobSpec(script="t.py", gpus_per_node=4, cpus_per_task=2)
    assert refusal(spec, SANDBOX_NODES) == (
        "the job asks for 1 node(s) with 8 CPUs (4 task(s) x 2), 4 GPUs each, but only 0 node(s) of the default "
        f"partition have that ({SANDBOX}); Slurm would queue it and it would never start.",
        "ask for cpus_per_task x tasks per node <= 4" + SINFO)
    assert refusal(spec, SANDBOX_NODES, flags=True)[1] == "ask for --cpus-per-task x tasks per node <= 4" + SINFO


@pytest.mark.parametrize(("mem", "asked"), [("4G", "4G memory"), ("2001", "2001 memory"), ("3000M", "3000M memory"),
                                            ("2048001K", "2048001K memory")])
def test_as_many_cpus_as_a_node_has_but_too_much_memory_asks_for_what_a_node_has(mem: str, asked: str) -> None:
    assert refusal(JobSpec(script="t.py", tasks_per_node=4, mem=mem), SANDBOX_NODES) == (
        f"the job asks for 1 node(s) with 4 CPUs (4 task(s) x 1), {asked} each, but only 0 node(s) of the default "
        f"partition have that ({SANDBOX}); Slurm would queue it and it would never start.",
        "ask for what a node has" + SINFO)


@pytest.mark.parametrize("mem", ["2000", "2000M", "1G", "2048000K", "0", "1K"])
def test_memory_a_node_has_fits_in_any_unit(mem: str) -> None:
    assert capacity(JobSpec(script="t.py", mem=mem), SANDBOX_NODES) == []


def test_more_nodes_than_the_partition_has_asks_for_at_most_those() -> None:
    assert refusal(JobSpec(script="t.py", nodes=5, exclude="node1"), SANDBOX_NODES) == (
        "the job asks for 5 node(s) with 1 CPUs (1 task(s) x 1) each, but only 3 node(s) of the default partition "
        "have that (node[2-4]: 4 CPUs, 4 GPUs, 2000 MB); Slurm would queue it and it would never start.",
        "ask for at most 3 node(s)" + SINFO)


def test_nodes_of_two_kinds_are_listed_largest_first_and_the_partition_named() -> None:
    spec = JobSpec(script="t.py", nodes=3, gpus_per_node=8, cpus_per_task=4, partition="gpu")
    assert refusal(spec, MIXED) == (
        "the job asks for 3 node(s) with 32 CPUs (8 task(s) x 4), 8 GPUs each, but only 2 node(s) of partition gpu "
        f"have that ({BOTH_KINDS}); Slurm would queue it and it would never start.",
        "ask for what a node has" + SINFO)


def test_an_exclude_that_leaves_no_node() -> None:
    spec = JobSpec(script="t.py", nodes=2, exclude="node[1-4]")
    assert refusal(spec, SANDBOX_NODES) == (
        "the job asks for 2 node(s) with 1 CPUs (1 task(s) x 1) each, but only 0 node(s) of the default partition "
        "have that (exclude leaves none); Slurm would queue it and it would never start.",
        "ask for fewer nodes in exclude" + SINFO)
    message, hint = refusal(spec, SANDBOX_NODES, flags=True)
    assert "(--exclude leaves none)" in message and hint == "ask for fewer nodes in --exclude" + SINFO


def test_a_nodelist_is_nodes_the_job_must_have_and_slurm_adds_others() -> None:
    """sbatch(1), --nodelist: the job gets these hosts "and possibly additional hosts as needed"."""
    assert capacity(JobSpec(script="t.py", nodes=3, nodelist="node[3-4]"), SANDBOX_NODES) == []
    assert capacity(JobSpec(script="t.py", nodes=2, nodelist="big1", gpus_per_node=8), MIXED) == []
    assert refusal(JobSpec(script="t.py", nodes=2, nodelist="small1", gpus_per_node=4, partition="gpu"), MIXED) == (
        "the job asks for 2 node(s) with 4 CPUs (4 task(s) x 1), 4 GPUs each, but small1 of its nodelist do(es) "
        f"not ({BOTH_KINDS}); Slurm would queue it and it would never start.",
        "ask for a nodelist without small1" + SINFO)
    message, hint = refusal(JobSpec(script="t.py", nodes=3, nodelist="big1,small[1-2]", gpus_per_node=4), MIXED,
                            flags=True)
    assert (message, hint) == (
        "the job asks for 3 node(s) with 4 CPUs (4 task(s) x 1), 4 GPUs each, but only 2 node(s) of the default "
        f"partition have that and small[1-2] of its --nodelist do(es) not ({BOTH_KINDS}); Slurm would queue it and "
        "it would never start.", "ask for a --nodelist without small[1-2]" + SINFO)


@pytest.mark.parametrize(("spec", "fits"), [
    (JobSpec(script="t.py", nodes=4, gpus_per_node=4), True),
    (JobSpec(script="t.py", nodes=5), False),
    (JobSpec(script="t.py", nodes=2, tasks_per_node=2, cpus_per_task=2), True),
    (JobSpec(script="t.py", tasks_per_node=2, cpus_per_task=3), False),
    (JobSpec(script="t.py", tasks_per_node=4), True),
    (JobSpec(script="t.py", tasks_per_node=5), False),
    (JobSpec(script="t.py", mem="2000M"), True),
    (JobSpec(script="t.py", mem="4G"), False),
    (JobSpec(script="t.py", nodes=2, exclude="node[1-3]"), False),
    (JobSpec(script="t.py", nodes=1, exclude="node[1-3]"), True),
    (JobSpec(script="t.py", nodes=2, nodelist="node[3-4]"), True),
])
def test_capacity_counts_the_nodes_that_fit(spec: JobSpec, fits: bool) -> None:
    assert (capacity(spec, SANDBOX_NODES) == []) is fits


def test_a_partition_slurm_does_not_have_is_an_error_and_unknown_nodes_say_nothing() -> None:
    (found,) = capacity(JobSpec(script="t.py", partition="gpu"), [])
    assert (found.severity, found.code, found.message, found.hint) == (
        "error", "never-starts", "partition=gpu: Slurm has no such partition.",
        "`sinfo -s` lists the partitions; give one of those")
    assert capacity(JobSpec(script="t.py", partition="gpu"), [], FLAGS)[0].message == (
        "--partition=gpu: Slurm has no such partition.")
    assert capacity(JobSpec(script="t.py"), []) == []


def test_memory_in_kilobytes_rounds_up_to_whole_megabytes_as_slurm_does() -> None:
    message, _ = refusal(JobSpec(script="t.py", tasks_per_node=5, mem="1K"), SANDBOX_NODES)
    assert message.startswith("the job asks for 1 node(s) with 5 CPUs (5 task(s) x 1), 1K memory each, but only 0 ")
