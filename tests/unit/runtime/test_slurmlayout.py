"""A Slurm step's layout from its variables: nodes, tasks per node, task 0's host, the job id."""

from __future__ import annotations

import pytest

from torchslurm.errors import EnvError
from torchslurm.runtime.slurmlayout import (
    first_node,
    hosts_store,
    idle_job_nodes,
    slurm_job_id,
    slurm_nodes,
    srun_locality,
    step_node_count,
    tasks_per_node,
)


def test_the_step_node_list_comes_before_the_jobs() -> None:
    assert slurm_nodes({"SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[01-04]"}) == ["gpu07", "gpu08"]
    assert slurm_nodes({"SLURM_JOB_NODELIST": "gpu[01-02]"}) == ["gpu01", "gpu02"]
    assert slurm_nodes({}) == []


def test_a_malformed_node_list_names_the_variable() -> None:
    with pytest.raises(EnvError, match=r"SLURM_STEP_NODELIST='gpu\[07-' is not a valid Slurm hostlist"):
        slurm_nodes({"SLURM_STEP_NODELIST": "gpu[07-"})


def test_task_zeros_host_is_the_first_node_or_loopback_alone() -> None:
    assert first_node(["gpu07", "gpu08"], 2) == "gpu07"
    assert first_node([], 1) == "127.0.0.1"
    with pytest.raises(EnvError, match="cannot tell which host runs rank 0") as info:
        first_node([], 2)
    assert "MASTER_ADDR=$(scontrol show hostnames" in (info.value.hint or "")


def test_tasks_per_node_in_slurms_compressed_form() -> None:
    assert tasks_per_node({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_TASKS_PER_NODE": "9"}, 4) == [2, 2, 2, 1]
    assert tasks_per_node({"SLURM_TASKS_PER_NODE": "4"}, 0) == [4]
    with pytest.raises(EnvError, match=r"lists 2 node\(s\) but the step node list has 3"):
        tasks_per_node({"SLURM_STEP_TASKS_PER_NODE": "2(x2)"}, 3)
    with pytest.raises(EnvError, match="cannot tell how many ranks run on this node"):
        tasks_per_node({}, 1)


def test_an_array_task_is_named_as_scontrol_takes_it() -> None:
    assert slurm_job_id({"SLURM_JOB_ID": "101", "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": "1"}) == "100_1"
    assert slurm_job_id({"SLURM_JOB_ID": "101"}) == "101"
    assert slurm_job_id({}) is None


def test_step_nodes_are_counted_only_inside_a_step() -> None:
    assert step_node_count({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "3"}) == 3
    assert step_node_count({"SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-2]"}) == 2
    assert step_node_count({"SLURM_STEP_NUM_NODES": "3"}) == 0


def test_torchrun_in_the_batch_shell_of_a_multi_node_job_leaves_nodes_idle() -> None:
    (warning,) = idle_job_nodes({"SLURM_JOB_NUM_NODES": "4"}, 1)
    assert "this Slurm job has 4 nodes" in warning.message and "the other nodes stay idle" in warning.message
    assert idle_job_nodes({"SLURM_JOB_NUM_NODES": "4", "SLURM_STEP_ID": "0"}, 1) == ()
    assert idle_job_nodes({"SLURM_JOB_NUM_NODES": "1"}, 1) == ()


STEP = {"SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu[01-03]", "SLURM_STEP_TASKS_PER_NODE": "4,2(x2)"}


@pytest.mark.parametrize(("world", "node", "expected"), [
    (8, "0", (4, 0, 3)),    # one rank per task
    (8, "2", (2, 2, 3)),
    (32, "1", (8, 1, 3)),   # a launcher below srun starting 4 ranks per task
    (12, "0", None),        # a world that is not a multiple of the step's 8 tasks
    (8, "3", None),         # SLURM_NODEID outside the step
])
def test_srun_locality_maps_the_world_onto_the_steps_tasks(world: int, node: str, expected: tuple | None) -> None:
    assert srun_locality({**STEP, "SLURM_NODEID": node}, world) == expected


def test_srun_locality_needs_a_step_with_its_layout() -> None:
    assert srun_locality({"SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "4"}, 4) is None  # batch shell
    assert srun_locality({"SLURM_STEP_ID": "0", "SLURM_NODEID": "0"}, 4) is None  # no tasks per node


@pytest.mark.parametrize(("node", "localid", "master", "expected"), [
    ("gpu01", "0", "gpu01", True), ("gpu01", "1", "gpu01", False), ("gpu02", "0", "gpu01", False),
    ("gpu02", "0", "gpu02", True), ("gpu01", "0", "10.1.0.7", None),
])
def test_the_first_task_of_the_masters_node_hosts_the_store(node: str, localid: str, master: str,
                                                            expected: bool | None) -> None:
    environ = {**STEP, "SLURM_NODEID": str(int(node[-1]) - 1), "SLURMD_NODENAME": node, "SLURM_LOCALID": localid}
    assert hosts_store(environ, ["gpu01", "gpu02", "gpu03"], master) is expected
    assert hosts_store({k: v for k, v in environ.items() if k != "SLURM_STEP_ID"}, ["gpu01"], master) is None
