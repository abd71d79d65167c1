"""A Slurm step's layout from its variables: nodes, tasks per node, task 0's host, the job id."""

from __future__ import annotations

import pytest

from torchslurm.errors import EnvError
from torchslurm.runtime.slurmlayout import (
    check_one_group_per_node,
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


def test_the_node_list_falls_back_to_slurm_nodelist_and_a_bad_one_says_what_to_do() -> None:
    assert slurm_nodes({"SLURM_NODELIST": "n[1-2]"}) == ["n1", "n2"]
    with pytest.raises(EnvError) as info:
        slurm_nodes({"SLURM_NODELIST": "n[2-1]"})
    assert info.value.hint == ("srun sets SLURM_NODELIST to the step's nodes; if a script exports it, remove that "
                               "line (`scontrol show hostnames` expands a valid one).")


def test_the_errors_of_a_layout_say_the_whole_fix() -> None:
    with pytest.raises(EnvError) as info:
        first_node([], 2)
    assert str(info.value) == (
        "srun task of a 2-node step without a node list (SLURM_STEP_NODELIST and SLURM_JOB_NODELIST unset or empty): "
        "cannot tell which host runs rank 0. HINT: srun sets them in every task; do not clear them in the script, or "
        "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) before srun.")
    with pytest.raises(EnvError) as info:
        tasks_per_node({}, 1)
    assert info.value.hint == "these are set by srun; do not start tasks with a partial copy of a Slurm environment."
    with pytest.raises(EnvError) as info:
        tasks_per_node({"SLURM_TASKS_PER_NODE": "2(x"}, 1)
    assert info.value.hint == ("srun sets SLURM_TASKS_PER_NODE to counts such as '2(x3),1'; if a script exports it, "
                               "remove that line.")


def test_an_array_task_needs_both_array_variables() -> None:
    assert slurm_job_id({"SLURM_JOB_ID": "101", "SLURM_ARRAY_JOB_ID": "100"}) == "101"
    assert slurm_job_id({"SLURM_JOB_ID": "101", "SLURM_ARRAY_TASK_ID": "1"}) == "101"


@pytest.mark.parametrize(("environ", "count"), [
    ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "3", "SLURM_STEP_NODELIST": "n[1-2]"}, 3),
    ({"SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-2]"}, 2),
    ({"SLURM_STEP_ID": "0", "SLURM_NODELIST": "n[1-4]"}, 4),
    ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "x", "SLURM_NODELIST": "n[1-4]"}, 4),
    ({"SLURM_STEP_ID": "0"}, 0), ({"SLURM_STEP_ID": "0", "SLURM_NODELIST": "n[2-1]"}, 0), ({"SLURM_NODELIST": "n1"}, 0),
])
def test_a_steps_node_count_from_slurms_count_or_its_node_list(environ: dict[str, str], count: int) -> None:
    assert step_node_count(environ) == count


TWO_BY_TWO = {"SLURM_STEP_ID": "0", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
              "SLURM_STEP_NODELIST": "n[1-2]"}


@pytest.mark.parametrize(("changes", "world", "layout"), [
    ({}, 4, (2, 1, 2)), ({}, 8, (4, 1, 2)),  # a launcher with 2 ranks per task
    ({}, 6, None), ({"SLURM_NODEID": None}, 4, None), ({"SLURM_NODEID": "2"}, 4, None),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, 6, None),  # does not match the node list: not this step's layout
    ({"SLURM_STEP_ID": None}, 4, None),
])
def test_a_world_started_by_an_srun_step_takes_its_layout(changes: dict[str, str | None], world: int,
                                                           layout: tuple[int, int, int] | None) -> None:
    environ = {k: v for k, v in {**TWO_BY_TWO, **changes}.items() if v is not None}
    found = srun_locality(environ, world)
    assert found == layout and (found is None or all(type(n) is int for n in found))


@pytest.mark.parametrize(("changes", "hosts"), [
    ({"SLURM_LOCALID": "0", "SLURMD_NODENAME": "n1"}, True), ({"SLURM_LOCALID": "1", "SLURMD_NODENAME": "n1"}, False),
    ({"SLURMD_NODENAME": "n1"}, True),  # no SLURM_LOCALID: the first task
    ({"SLURM_LOCALID": "0", "SLURM_NODEID": "0"}, True),  # no SLURMD_NODENAME: the node list says where it is
    ({"SLURM_LOCALID": "0", "SLURM_NODEID": "1"}, False),
    ({"SLURM_LOCALID": "0", "SLURM_NODEID": "2"}, None), ({"SLURM_LOCALID": "0", "SLURM_NODEID": None}, None),
])
def test_the_store_runs_in_the_first_task_of_the_masters_node(changes: dict[str, str | None],
                                                              hosts: bool | None) -> None:
    environ = {k: v for k, v in {**TWO_BY_TWO, **changes}.items() if v is not None}
    assert hosts_store(environ, ["n1", "n2"], "n1") is hosts


def test_torchrun_in_a_batch_shell_names_the_variable_that_counts_the_jobs_nodes() -> None:
    (warning,) = idle_job_nodes({"SLURM_NNODES": "3"}, 1)
    assert str(warning) == (
        "this Slurm job has 3 nodes (SLURM_NNODES=3) but torchrun, started without srun, spans 1: the other nodes "
        "stay idle. HINT: srun --ntasks-per-node=1 torchrun --nnodes=3 --rdzv-backend=c10d --rdzv-endpoint=<first "
        "node>:$((10000 + SLURM_JOB_ID * 8 % 22768)) train.py, or `torchslurm run train.py`.")
    assert idle_job_nodes({"SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "3"}, 2) == ()
    assert idle_job_nodes({"SLURM_NNODES": "3", "SLURM_STEP_ID": "0"}, 1) == ()
    assert idle_job_nodes({}, 1) == ()


@pytest.mark.parametrize(("environ", "sizes"), [
    ({"GROUP_WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "2"}, "GROUP_WORLD_SIZE=1"),
    ({"LOCAL_WORLD_SIZE": "1"}, "LOCAL_WORLD_SIZE=1"),
    ({}, "LOCAL_WORLD_SIZE=2"),  # torchrun's own variables unset: its world is on this node
])
def test_one_group_per_node_of_a_multi_node_step_is_refused_in_full(environ: dict[str, str], sizes: str) -> None:
    step = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "3", **environ}
    with pytest.raises(EnvError) as info:
        check_one_group_per_node(step, 2, 1, "torchrun")
    assert str(info.value) == (
        f"torchrun's world is 2 rank(s) on 1 node(s) (WORLD_SIZE=2, {sizes}) but its srun step spans 3 nodes "
        "(SLURM_STEP_NUM_NODES=3): each node runs its own separate training (torchrun --standalone, --nnodes=1 or a "
        "launcher's one-node setting under srun), and they would all write the same checkpoints. HINT: use one "
        "rendezvous for all nodes: srun torchrun --nnodes=3 --nproc-per-node=N --rdzv-backend=c10d "
        "--rdzv-endpoint=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1):$((10000 + SLURM_JOB_ID * 8 % "
        "22768)) --rdzv-id=$SLURM_JOB_ID train.py; or let torchslurm start the ranks: `torchslurm run train.py` in "
        "the batch script.")
    with pytest.raises(EnvError, match=r"^the launcher's world is 2"):
        check_one_group_per_node(step, 2, 1, "RANK set in the environment")
    check_one_group_per_node(step, 6, 3, "torchrun")  # spans the step: fine
