"""distenv.detect on plain environment dicts, shaped like what srun/sbatch/torchrun really set."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from torchslurm.errors import ConfigError, EnvError
from torchslurm.runtime.devices import choose_device
from torchslurm.runtime.distenv import detect
from torchslurm.runtime.ports import derived_port


def no_port() -> int:
    raise AssertionError("a Slurm job must not need a free local port")


# One srun task (rank 3) of `sbatch --nodes=2 --ntasks-per-node=2` + `srun python ...`.
SRUN_TASK = {
    "SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
    "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_STEP_NODELIST": "node[1-2]", "SLURMD_NODENAME": "node2",
}

BATCH_SHELL = {
    "SLURM_JOB_ID": "4243", "SLURM_NTASKS": "4", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NODELIST": "node[1-2]",
    "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURMD_NODENAME": "node1",
}

TORCHRUN_IN_SRUN = {
    **SRUN_TASK,
    "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "0",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_TASKS_PER_NODE": "1(x2)",
    "TORCHELASTIC_RUN_ID": "4242", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "node1", "MASTER_PORT": "41000",
}


def test_srun_task_placement() -> None:
    env = detect(SRUN_TASK, free_port=no_port)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert (env.node_rank, env.num_nodes, env.master_addr, env.launcher) == (1, 2, "node1", "srun")
    assert env.master_port == derived_port("4242", "0")
    assert env.job_id == "4242" and "srun task 3 of 4" in env.reason


def test_step_nodelist_wins_over_job_nodelist() -> None:
    # A step on a subset of the job's nodes: rank 0 runs on the step's first node.
    env = detect({**SRUN_TASK, "SLURM_JOB_NODELIST": "node[1-4]", "SLURM_STEP_NODELIST": "node[3-4]"},
                 free_port=no_port)
    assert env.master_addr == "node3"


def test_uneven_tasks_per_node() -> None:
    env = detect({**SRUN_TASK, "SLURM_PROCID": "4", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
                  "SLURM_STEP_NUM_TASKS": "5", "SLURM_STEP_TASKS_PER_NODE": "4,1",
                  "SLURM_STEP_NODELIST": "gpu[07-08]"}, free_port=no_port)
    assert (env.rank, env.local_world_size, env.master_addr) == (4, 1, "gpu07")


def test_explicit_master_wins() -> None:
    env = detect({**SRUN_TASK, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29511"}, free_port=no_port)
    assert (env.master_addr, env.master_port) == ("10.0.0.5", 29511)


def test_torchrun_inside_srun_uses_torchruns_rank() -> None:
    env = detect(TORCHRUN_IN_SRUN, free_port=no_port)
    assert (env.rank, env.world_size, env.local_rank, env.node_rank, env.num_nodes) == (3, 4, 1, 1, 2)
    assert (env.launcher, env.master_addr, env.master_port) == ("torchrun", "node1", 41000)


def test_torchrun_agent_store_and_restart_budget_are_read() -> None:
    first = detect(TORCHRUN_IN_SRUN, free_port=no_port)
    assert (first.agent_store, first.restart_count, first.restarts_left) == (False, 0, 0)
    again = detect({**TORCHRUN_IN_SRUN, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2",
                    "TORCHELASTIC_MAX_RESTARTS": "3"}, free_port=no_port)
    assert (again.agent_store, again.restart_count, again.max_restarts, again.restarts_left) == (True, 2, 3, 1)
    with pytest.raises(EnvError, match=r"TORCHELASTIC_RESTART_COUNT='x' is not an integer.*HINT"):
        detect({**TORCHRUN_IN_SRUN, "TORCHELASTIC_RESTART_COUNT": "x"}, free_port=no_port)


def test_batch_shell_is_one_process_and_warns_about_srun() -> None:
    env = detect(BATCH_SHELL, free_port=no_port)
    assert (env.rank, env.world_size, env.launcher) == (0, 1, "batch")
    assert len(env.warnings) == 1
    assert "SLURM_NTASKS=4" in env.warnings[0].message
    assert env.warnings[0].hint is not None and env.warnings[0].hint.startswith("srun python train.py")


def test_single_task_allocation_has_no_warning() -> None:
    env = detect({**BATCH_SHELL, "SLURM_NTASKS": "1", "SLURM_NNODES": "1"}, free_port=no_port)
    assert env.warnings == ()


def test_local_picks_a_free_port() -> None:
    env = detect({"PATH": "/usr/bin"}, free_port=lambda: 12345)
    assert (env.launcher, env.world_size, env.master_addr, env.master_port) == ("local", 1, "127.0.0.1", 12345)


def test_open_mpi_under_slurm_takes_rank_from_mpirun() -> None:
    env = detect({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
                  "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_NODELIST": "n[1-2]",
                  "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
                  "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, free_port=no_port)
    assert (env.rank, env.world_size, env.local_rank, env.launcher, env.master_addr) == (5, 8, 1, "mpi", "n1")


@pytest.mark.parametrize("launcher", ["torchrun", "open mpi"])
def test_without_a_node_rank_variable_the_node_is_the_rank_over_the_ranks_per_node(launcher: str) -> None:
    """RANK=6 with 4 ranks per node (no GROUP_RANK, no OMPI_COMM_WORLD_NODE_RANK) runs on node 1 of 2."""
    environ = {"RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
               "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"} if launcher == "torchrun" else {
        "OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    env = detect(environ, free_port=no_port)
    assert (env.rank, env.local_rank, env.node_rank, env.num_nodes) == (6, 2, 1, 2)


def test_array_job_id() -> None:
    env = detect({**SRUN_TASK, "SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": "2"}, free_port=no_port)
    assert env.job_id == "4240_2"


def test_torchrun_environ_round_trip() -> None:
    env = detect(SRUN_TASK, free_port=no_port)
    again = detect({**env.torchrun_environ(), "SLURM_STEP_ID": "0", "SLURM_PROCID": "3"}, free_port=no_port)
    assert (again.rank, again.world_size, again.local_rank, again.master_addr, again.master_port) == (
        env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port)




BROKEN = [
    ({**SRUN_TASK, "SLURM_PROCID": "4"}, "SLURM_PROCID=4 is outside 0..3"),
    ({**SRUN_TASK, "SLURM_PROCID": "three"}, "SLURM_PROCID='three' is not an integer"),
    ({**SRUN_TASK, "SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 is outside 0..1"),
    ({**SRUN_TASK, "SLURM_NODEID": "2"}, "SLURM_NODEID=2 is outside 0..1"),
    ({**SRUN_TASK, "SLURM_STEP_TASKS_PER_NODE": "3(x2)"}, "adds up to 6 tasks but SLURM_STEP_NUM_TASKS=4"),
    ({**SRUN_TASK, "SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "lists 3 node(s) but the step node list has 2"),
    ({**SRUN_TASK, "SLURM_STEP_NODELIST": "node[2-1]"}, "SLURM_STEP_NODELIST='node[2-1]' is not a valid"),
    ({**SRUN_TASK, "SLURM_STEP_TASKS_PER_NODE": "2(x"}, "SLURM_STEP_TASKS_PER_NODE='2(x' is malformed"),
    ({k: v for k, v in SRUN_TASK.items() if "TASKS_PER_NODE" not in k}, "without SLURM_STEP_TASKS_PER_NODE"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set"),
    ({"TORCHELASTIC_RUN_ID": "x", "RANK": "0"}, "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set"),
    ({**TORCHRUN_IN_SRUN, "LOCAL_RANK": "2"}, "LOCAL_RANK=2 is outside 0..1"),
    ({**TORCHRUN_IN_SRUN, "RANK": "4"}, "RANK=4 is outside 0..3"),
    ({**TORCHRUN_IN_SRUN, "WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
    ({**TORCHRUN_IN_SRUN, "MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"),
    ({**SRUN_TASK, "MASTER_PORT": "http"}, "MASTER_PORT='http' is not an integer"),
    # `export RANK=$SLURM_PROCID` in the batch script, inherited by every srun task
    ({**SRUN_TASK, "RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "node1",
      "MASTER_PORT": "12355"}, "this srun task has SLURM_PROCID=3, so every task inherited the same RANK"),
    # `export RANK=$SLURM_PROCID` alone: task 0 has RANK == SLURM_PROCID, and the rest is missing
    ({**SRUN_TASK, "SLURM_PROCID": "0", "RANK": "0"}, "RANK=0 is set in this srun task but Slurm never sets RANK, "
     "and WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not set: the job script exports RANK"),
    ({**BATCH_SHELL, "RANK": "0"}, "RANK=0 is set in this Slurm batch shell but Slurm never sets RANK"),
    # `srun -N2 torchrun --standalone --nproc-per-node=2`: one separate 2-rank world per node
    ({**SRUN_TASK, "TORCHELASTIC_RUN_ID": "none", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
      "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "localhost",
      "MASTER_PORT": "29400"}, "torchrun's world is 2 rank(s) on 1 node(s) (WORLD_SIZE=2, GROUP_WORLD_SIZE=1) "
     "but its srun step spans 2 nodes"),
    # another launcher told of one node (its LOCAL_WORLD_SIZE is its whole world) under a 2-node srun step
    ({**SRUN_TASK, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8",
      "MASTER_ADDR": "localhost", "MASTER_PORT": "29400"}, "the launcher's world is 8 rank(s) on 1 node(s) "
     "(WORLD_SIZE=8, LOCAL_WORLD_SIZE=8) but its srun step spans 2 nodes"),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "MASTER_ADDR is not set"),
    ({**BATCH_SHELL, "SLURM_NTASKS": "many"}, "SLURM_NTASKS='many' is not an integer"),
]


@pytest.mark.parametrize(("environ", "message"), BROKEN, ids=[m[:60] for _, m in BROKEN])
def test_broken_environment_is_a_clear_error(environ: dict[str, str], message: str) -> None:
    with pytest.raises(EnvError) as info:
        detect(environ, free_port=lambda: 12345)
    assert message in info.value.message
    assert info.value.hint and "HINT:" not in info.value.message  # one fix, given as data


@pytest.mark.parametrize("environ", [{**SRUN_TASK, "SLURM_PROCID": "0", "RANK": "0"}, {**BATCH_SHELL, "RANK": "0"}])
def test_an_exported_rank_says_remove_the_export_not_use_torchslurm_run(environ: dict[str, str]) -> None:
    """`torchslurm run` inherits the exported RANK too: a hint pointing at it would loop."""
    with pytest.raises(EnvError) as info:
        detect(environ, free_port=lambda: 12345)
    assert info.value.hint is not None and "remove the `export RANK=…` line" in info.value.hint
    assert "start the script with torchrun or `torchslurm run`" not in info.value.hint


def test_a_launcher_below_srun_with_several_ranks_per_task_is_not_an_exported_rank() -> None:
    """deepspeed under `srun --ntasks-per-node=1` on 2 nodes: task 1 (SLURM_PROCID=1) runs ranks 8-15,
    numbered by the launcher, whose world (16) is not the step's 2 tasks."""
    deepspeed = {**SRUN_TASK, "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2",
                 "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_LOCALID": "0", "RANK": "9", "LOCAL_RANK": "1",
                 "WORLD_SIZE": "16", "MASTER_ADDR": "node1", "MASTER_PORT": "29500"}
    env = detect(deepspeed, free_port=no_port)
    assert (env.rank, env.world_size, env.local_rank) == (9, 16, 1)
    spanning = {**deepspeed, "LOCAL_WORLD_SIZE": "8"}  # 16 ranks, 8 per node: both nodes of the step
    assert detect(spanning, free_port=no_port).num_nodes == 2


def test_torchrun_spanning_its_whole_step_is_fine_and_one_node_of_a_batch_job_is_a_warning() -> None:
    spans = {**TORCHRUN_IN_SRUN, "GROUP_WORLD_SIZE": "2", "SLURM_STEP_NUM_NODES": "2"}
    assert detect(spans, free_port=no_port).num_nodes == 2
    in_batch = {**BATCH_SHELL, "TORCHELASTIC_RUN_ID": "none", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "29400"}
    env = detect(in_batch, free_port=no_port)
    assert [w.message for w in env.warnings] == [
        "this Slurm job has 2 nodes (SLURM_JOB_NUM_NODES=2) but torchrun, started without srun, spans 1: "
        "the other nodes stay idle."]


RECORDED = sorted((Path(__file__).parents[2] / "fixtures" / "slurm_env").glob("*.json"))


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_srun_steps_give_every_task_a_distinct_rank_and_one_master(path: Path) -> None:
    """Environments a real slurmd gave each task of a 2 nodes × 2 tasks step (the sandbox cluster)."""
    tasks = json.loads(path.read_text())["tasks"]
    envs = [detect(task["environ"], free_port=no_port) for task in tasks]
    assert sorted(env.rank for env in envs) == list(range(len(tasks)))
    assert {(env.world_size, env.num_nodes, env.master_addr, env.master_port, env.launcher) for env in envs} == {
        (len(tasks), 2, "node1", envs[0].master_port, "srun")}
    for env, task in zip(envs, tasks, strict=True):
        assert env.rank == int(task["environ"]["SLURM_PROCID"])
        assert (env.local_rank, env.local_world_size) == (task["local_rank"], task["local_world_size"])


def _without(environ: dict[str, str], *names: str, **changes: str) -> dict[str, str]:
    return {**{k: v for k, v in environ.items() if k not in names}, **changes}


@pytest.mark.parametrize("environ", [
    _without(SRUN_TASK, "SLURM_STEP_NODELIST", SLURM_JOB_NODELIST=""),
    _without(SRUN_TASK, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"),
])
def test_srun_task_without_node_list_is_an_env_error(environ: dict[str, str]) -> None:
    with pytest.raises(EnvError, match="2-node step without a node list") as info:
        detect(environ, free_port=no_port)
    assert "MASTER_ADDR=$(scontrol show hostnames" in (info.value.hint or "")


def test_one_node_srun_task_without_node_list_runs_its_master_here() -> None:
    environ = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
               "SLURM_NODEID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": ""}
    env = detect(environ, free_port=no_port)
    assert (env.rank, env.world_size, env.num_nodes, env.master_addr) == (1, 2, 1, "127.0.0.1")


@pytest.mark.parametrize("value", ["12_0", "١٢", "12.0", "0x1f"])
def test_slurm_ids_are_read_strictly(value: str) -> None:
    """Python's int() reads `12_0` as 120 and Arabic-Indic digits as 12: another job's port, silently."""
    with pytest.raises(EnvError, match=f"SLURM_JOB_ID={value!r} is not an integer"):
        detect(_without(SRUN_TASK, "MASTER_PORT", SLURM_JOB_ID=value), free_port=no_port)
    with pytest.raises(EnvError, match=f"SLURM_PROCID={value!r} is not an integer"):
        detect(_without(SRUN_TASK, SLURM_PROCID=value), free_port=no_port)


def bash_c_task(procid: int, nodeid: int, localid: int, **extra: str) -> dict[str, str]:
    """A task of `srun bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID python train.py'` on 2 nodes x 8
    tasks, with WORLD_SIZE, MASTER_ADDR and MASTER_PORT exported by the batch script (no LOCAL_WORLD_SIZE)."""
    return {**SRUN_TASK, "SLURM_PROCID": str(procid), "SLURM_NODEID": str(nodeid), "SLURM_LOCALID": str(localid),
            "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "16", "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
            "SLURM_TASKS_PER_NODE": "8(x2)", "SLURMD_NODENAME": f"node{nodeid + 1}", "CUDA_VISIBLE_DEVICES":
            "0,1,2,3,4,5,6,7", "RANK": str(procid), "LOCAL_RANK": str(localid), "WORLD_SIZE": "16",
            "MASTER_ADDR": "node1", "MASTER_PORT": "29500", **extra}


def test_rank_and_local_rank_from_slurm_without_local_world_size_take_the_node_layout_from_slurm() -> None:
    """Read as 16 ranks on one node, this correct launch was refused ('16 ranks share the 8 CUDA devices')."""
    envs = [detect(bash_c_task(p, p // 8, p % 8), free_port=no_port) for p in range(16)]
    assert {(e.world_size, e.local_world_size, e.num_nodes, e.local_world_known) for e in envs} == {(16, 8, 2, True)}
    assert [e.node_rank for e in envs] == [0] * 8 + [1] * 8 and all(not e.warnings for e in envs)
    chosen = {(e.node_rank, choose_device(bash_c_task(e.rank, e.node_rank, e.local_rank), e.local_rank,
                                          e.gpu_sharers, 8).index) for e in envs}
    assert len(chosen) == 16  # every rank its own GPU


def test_rank_variables_without_any_node_layout_warn_and_never_refuse_a_rank_that_has_a_gpu() -> None:
    hand_set = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    env = detect(hand_set, free_port=no_port)
    assert not env.local_world_known and env.gpu_sharers == 2
    assert "LOCAL_WORLD_SIZE is not" in env.warnings[0].message and "export LOCAL_WORLD_SIZE" in env.warnings[0].hint
    assert choose_device(hand_set, env.local_rank, env.gpu_sharers, 4).index == 1
    with pytest.raises(ConfigError, match="rank slot 1 has no GPU"):  # a rank with no GPU is still refused
        choose_device(hand_set, env.local_rank, env.gpu_sharers, 1)
    told = detect({**hand_set, "LOCAL_WORLD_SIZE": "4"}, free_port=no_port)
    assert told.local_world_known and told.gpu_sharers == 4 and not told.warnings


def hostfile_task(procid: int, node: str, localid: int, **extra: str) -> dict[str, str]:
    """`sbatch -N2 -n4` with SLURM_HOSTFILE listing node2 before node1 and `srun --distribution=arbitrary`:
    tasks 0-1 run on node2, tasks 2-3 on node1 (the step's first node)."""
    return {**SRUN_TASK, "SLURM_PROCID": str(procid), "SLURM_NODEID": str(int(node[-1]) - 1),
            "SLURM_LOCALID": str(localid), "SLURMD_NODENAME": node, "SLURM_DISTRIBUTION": "arbitrary", **extra}


HOSTFILE_STEP = [(0, "node2", 0), (1, "node2", 1), (2, "node1", 0), (3, "node1", 1)]


def test_with_a_hostfile_the_store_runs_where_the_master_address_points_not_with_rank_0() -> None:
    envs = {p: detect(hostfile_task(p, n, loc), free_port=no_port) for p, n, loc in HOSTFILE_STEP}
    assert {e.master_addr for e in envs.values()} == {"node1"}
    assert [p for p, e in envs.items() if e.hosts_store] == [2]  # the first task of node1, not rank 0 on node2
    assert "the store runs on node1 (the step's first node) in its first task" in envs[0].reason
    # `torchslurm run` as these srun tasks: its ranks see torchrun-style variables and keep the rule
    children = [detect({**hostfile_task(p, n, loc), **envs[p].torchrun_environ()}, free_port=no_port)
                for p, n, loc in HOSTFILE_STEP]
    assert [e.rank for e in children if e.hosts_store] == [2]


def test_a_master_address_that_is_not_a_step_node_leaves_the_store_with_rank_0() -> None:
    by_address = {p: detect(hostfile_task(p, n, loc, MASTER_ADDR="198.18.0.12"), free_port=no_port)
                  for p, n, loc in HOSTFILE_STEP}
    assert [p for p, e in by_address.items() if e.hosts_store] == [0]
    assert "rank 0 hosts the store on 198.18.0.12 (MASTER_ADDR)" in by_address[1].reason
    torchrun = detect({**TORCHRUN_IN_SRUN, "RANK": "0", "LOCAL_RANK": "0", "SLURM_PROCID": "0"}, free_port=no_port)
    assert torchrun.hosts_store and torchrun.store_host is None  # torchrun's own master is its rank 0


# -- every field of every launcher's placement, every variable named in its error -----------------------

def _fields(environ: dict[str, str]) -> dict[str, object]:
    env = detect(environ, free_port=lambda: 12345)
    return {**dataclasses.asdict(env), "warnings": [str(w) for w in env.warnings]}


_PLAIN = {"warnings": [], "agent_store": False, "store_host": None, "local_world_known": True, "restart_count": 0,
          "max_restarts": 0}
MPI = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
       "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
TORCHRUN_BARE = {"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h",
                 "MASTER_PORT": "29500"}
ONE_TASK_STEP = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "1", "SLURM_PROCID": "0", "SLURM_TASKS_PER_NODE": "1",
                 "SLURM_JOB_NODELIST": "n1"}


@pytest.mark.parametrize(("environ", "expected"), [
    (SRUN_TASK, {**_PLAIN, "rank": 3, "local_rank": 1, "world_size": 4, "local_world_size": 2, "node_rank": 1,
                 "num_nodes": 2, "master_addr": "node1", "master_port": derived_port("4242", "0"), "launcher": "srun",
                 "job_id": "4242", "store_host": False, "reason": "srun task 3 of 4 in step 4242.0 on 2 node(s); the "
                 "store runs on node1 (the step's first node) in its first task (SLURM_LOCALID=0), wherever rank 0 "
                 "runs."}),
    (ONE_TASK_STEP, {**_PLAIN, "rank": 0, "local_rank": 0, "world_size": 1, "local_world_size": 1, "node_rank": 0,
                     "num_nodes": 1, "master_addr": "n1", "master_port": derived_port("9", "1"), "launcher": "srun",
                     "job_id": "9", "reason": "srun task 0 of 1 in step 9.1 on 1 node(s); rank 0 hosts the store on "
                     "n1 (the step's first node)."}),
    (TORCHRUN_IN_SRUN, {**_PLAIN, "rank": 3, "local_rank": 1, "world_size": 4, "local_world_size": 2, "node_rank": 1,
                        "num_nodes": 2, "master_addr": "node1", "master_port": 41000, "launcher": "torchrun",
                        "job_id": "4242", "reason": "torchrun: RANK=3 of WORLD_SIZE=4, master node1:41000."}),
    (TORCHRUN_BARE, {**_PLAIN, "rank": 1, "local_rank": 1, "world_size": 2, "local_world_size": 2, "node_rank": 0,
                     "num_nodes": 1, "master_addr": "h", "master_port": 29500, "launcher": "torchrun", "job_id": None,
                     "reason": "torchrun: RANK=1 of WORLD_SIZE=2, master h:29500."}),
    (bash_c_task(9, 1, 1), {**_PLAIN, "rank": 9, "local_rank": 1, "world_size": 16, "local_world_size": 8,
                            "node_rank": 1, "num_nodes": 2, "master_addr": "node1", "master_port": 29500,
                            "launcher": "torchrun", "job_id": "4242", "store_host": False,
                            "reason": "RANK set in the environment: RANK=9 of WORLD_SIZE=16, master node1:29500; the "
                            "store runs on node1 (MASTER_ADDR) in its first task (SLURM_LOCALID=0), wherever rank 0 "
                            "runs."}),
    (MPI, {**_PLAIN, "rank": 5, "local_rank": 1, "world_size": 8, "local_world_size": 4, "node_rank": 1,
           "num_nodes": 2, "master_addr": "10.0.0.1", "master_port": 29500, "launcher": "mpi", "job_id": None,
           "reason": "mpirun (Open MPI) rank 5 of 8, master 10.0.0.1."}),
    ({**MPI, "OMPI_COMM_WORLD_SIZE": "7", "OMPI_COMM_WORLD_NODE_RANK": "0", "SLURM_JOB_ID": "5"},
     {**_PLAIN, "rank": 5, "local_rank": 1, "world_size": 7, "local_world_size": 4, "node_rank": 0, "num_nodes": 2,
      "master_addr": "10.0.0.1", "master_port": 29500, "launcher": "mpi", "job_id": "5",
      "reason": "mpirun (Open MPI) rank 5 of 7, master 10.0.0.1."}),
    ({"OMPI_COMM_WORLD_RANK": "0", "MASTER_ADDR": "10.0.0.1"},
     {**_PLAIN, "rank": 0, "local_rank": 0, "world_size": 1, "local_world_size": 1, "node_rank": 0, "num_nodes": 1,
      "master_addr": "10.0.0.1", "master_port": 12345, "launcher": "mpi", "job_id": None,
      "reason": "mpirun (Open MPI) rank 0 of 1, master 10.0.0.1."}),
    (BATCH_SHELL, {**_PLAIN, "rank": 0, "local_rank": 0, "world_size": 1, "local_world_size": 1, "node_rank": 0,
                   "num_nodes": 1, "master_addr": "127.0.0.1", "master_port": derived_port("4243", "batch"),
                   "launcher": "batch", "job_id": "4243", "reason": "inside Slurm job 4243 but not in an srun step "
                   "(sbatch or salloc shell): a single process.", "warnings": [
                       "this Slurm allocation has 4 task(s) on 2 node(s) (SLURM_NTASKS=4, SLURM_NNODES=2) but this "
                       "process was not started by srun, so it runs alone and uses one node's resources. HINT: srun "
                       "python train.py, or `torchslurm run train.py`, which starts one rank per allocated task on "
                       "every node."]}),
    ({"SLURM_JOB_ID": "12", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29501"},
     {**_PLAIN, "rank": 0, "local_rank": 0, "world_size": 1, "local_world_size": 1, "node_rank": 0, "num_nodes": 1,
      "master_addr": "10.0.0.2", "master_port": 29501, "launcher": "batch", "job_id": "12",
      "reason": "inside Slurm job 12 but not in an srun step (sbatch or salloc shell): a single process."}),
    ({"MASTER_ADDR": "10.0.0.3"}, {**_PLAIN, "rank": 0, "local_rank": 0, "world_size": 1, "local_world_size": 1,
                                   "node_rank": 0, "num_nodes": 1, "master_addr": "10.0.0.3", "master_port": 12345,
                                   "launcher": "local", "job_id": None, "reason": "no launcher variables (torchrun, "
                                   "srun, mpirun) found: a single local process."}),
], ids=["srun", "one-task-step", "torchrun-in-srun", "torchrun", "bash-c", "mpi", "mpi-node-rank", "mpi-alone",
        "batch", "batch-one-task", "local"])
def test_every_field_of_the_placement(environ: dict[str, str], expected: dict[str, object]) -> None:
    assert _fields(environ) == expected


@pytest.mark.parametrize(("environ", "name"), [
    *((TORCHRUN_IN_SRUN, name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE",
                                            "GROUP_RANK", "TORCHELASTIC_MAX_RESTARTS")),
    *((MPI, "OMPI_COMM_WORLD_" + name) for name in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "NODE_RANK")),
    *((SRUN_TASK, name) for name in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID")),
    ({**SRUN_TASK, "SLURM_STEP_NUM_TASKS": None}, "SLURM_NTASKS"),
    *((BATCH_SHELL, name) for name in ("SLURM_NTASKS", "SLURM_NNODES")),
    ({**BATCH_SHELL, "SLURM_NNODES": None}, "SLURM_JOB_NUM_NODES"),
])
def test_a_variable_that_is_not_a_number_is_named(environ: dict[str, str | None], name: str) -> None:
    broken = {k: v for k, v in {**environ, name: "x"}.items() if v is not None}
    with pytest.raises(EnvError) as info:
        detect(broken, free_port=lambda: 12345)
    assert info.value.message.startswith(f"{name}='x' is not an integer.")


@pytest.mark.parametrize(("environ", "message"), [
    ({**TORCHRUN_IN_SRUN, "LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE=0 must be at least 1."),
    ({**TORCHRUN_IN_SRUN, "LOCAL_RANK": "2"}, "LOCAL_RANK=2 is outside 0..1 (LOCAL_WORLD_SIZE=2)."),
    ({**MPI, "OMPI_COMM_WORLD_RANK": "8"}, "OMPI_COMM_WORLD_RANK=8 is outside 0..7 (OMPI_COMM_WORLD_SIZE=8)."),
    ({**MPI, "OMPI_COMM_WORLD_LOCAL_RANK": "4"},
     "OMPI_COMM_WORLD_LOCAL_RANK=4 is outside 0..3 (OMPI_COMM_WORLD_LOCAL_SIZE=4)."),
    ({**SRUN_TASK, "SLURM_PROCID": "4"}, "SLURM_PROCID=4 is outside 0..3 (SLURM_STEP_NUM_TASKS=4)."),
    ({**SRUN_TASK, "SLURM_NODEID": "2"}, "SLURM_NODEID=2 is outside 0..1 (the number of step nodes=2)."),
    ({**SRUN_TASK, "SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 is outside 0..1 (this node's task count=2)."),
    ({**SRUN_TASK, "SLURM_STEP_TASKS_PER_NODE": "3(x2)"},
     "SLURM_STEP_TASKS_PER_NODE='3(x2)' adds up to 6 tasks but SLURM_STEP_NUM_TASKS=4."),
    ({**SRUN_TASK, "SLURM_STEP_TASKS_PER_NODE": None, "SLURM_TASKS_PER_NODE": "3(x2)"},
     "SLURM_TASKS_PER_NODE='3(x2)' adds up to 6 tasks but SLURM_STEP_NUM_TASKS=4."),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
     "mpirun started this process (OMPI_COMM_WORLD_RANK=1) but MASTER_ADDR is not set, and outside Slurm there is no "
     "node list to find rank 0's host."),
])
def test_a_placement_outside_its_sizes_says_which_variables_disagree(environ: dict[str, str | None],
                                                                     message: str) -> None:
    with pytest.raises(EnvError) as info:
        detect({k: v for k, v in environ.items() if v is not None}, free_port=lambda: 12345)
    assert info.value.message == message


def test_the_hints_of_a_half_torchrun_environment_and_of_mpirun_without_a_master() -> None:
    with pytest.raises(EnvError) as info:
        detect({"RANK": "1", "WORLD_SIZE": "2"}, free_port=no_port)
    assert str(info.value) == (
        "RANK set in the environment, but LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set (RANK=1, WORLD_SIZE=2): half "
        "a torchrun environment. HINT: start the script with torchrun or `torchslurm run`, or unset RANK so that "
        "torchslurm derives the placement from Slurm.")
    with pytest.raises(EnvError, match=r"^torchrun, but WORLD_SIZE"):
        detect({"TORCHELASTIC_RUN_ID": "x", "RANK": "0"}, free_port=no_port)
    with pytest.raises(EnvError) as info:
        detect({"OMPI_COMM_WORLD_RANK": "0"}, free_port=no_port)
    assert info.value.hint == "mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<free port> python train.py"


def test_torchrun_alone_needs_only_rank_or_its_run_id() -> None:
    assert detect({**TORCHRUN_BARE, "RANK": "0", "LOCAL_RANK": "0"}, free_port=no_port).rank == 0
    only_run_id = {k: v for k, v in TORCHRUN_BARE.items() if k != "RANK"}
    with pytest.raises(EnvError, match=r"^torchrun, but RANK not set"):
        detect(only_run_id, free_port=no_port)


@pytest.mark.parametrize(("launcher", "reported"), [("srun", "srun"), ("mpi", "mpi"), ("slurm", "torchrun")])
def test_torchslurm_run_says_which_launcher_started_its_ranks(launcher: str, reported: str) -> None:
    assert detect({**TORCHRUN_BARE, "TORCHSLURM_LAUNCHER": launcher}, free_port=no_port).launcher == reported


def test_a_rank_per_srun_task_is_recognised_by_step_procid_and_world() -> None:
    """`torchslurm run` as an srun task hands its rank torchrun-style variables: the store still runs in the first
    task of the master's node. A rank whose world or rank does not match the step's tasks is not such a task."""
    base = bash_c_task(9, 1, 1)
    assert detect(base, free_port=no_port).store_host is False
    for changes in ({"SLURM_STEP_ID": None}, {"SLURM_PROCID": "8", "RANK": "9"},
                    {"SLURM_STEP_NUM_TASKS": None, "SLURM_NTASKS": "16"}, {"SLURM_STEP_NUM_TASKS": "32"}):
        environ = {k: v for k, v in {**base, **changes}.items() if v is not None}
        try:
            env = detect(environ, free_port=no_port)
        except EnvError:
            continue  # an inconsistent step is refused outright: fine too
        assert (env.store_host is None) is ("SLURM_NTASKS" not in changes), changes


_EXPORTED_HINT = ("remove the `export RANK=…` line (and any WORLD_SIZE/LOCAL_RANK/MASTER_* exports) from the job "
                  "script, or `unset RANK` before srun/`torchslurm run`; torchslurm derives every rank from Slurm "
                  "(SLURM_PROCID).")


@pytest.mark.parametrize(("environ", "where", "seen"), [
    ({**SRUN_TASK, "RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "node1", "MASTER_PORT": "1"},
     "this srun task", "this srun task has SLURM_PROCID=3, so every task inherited the same RANK"),
    ({**BATCH_SHELL, "RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "node1"},
     "this Slurm batch shell", "MASTER_PORT is not set"),
    ({**{k: v for k, v in SRUN_TASK.items() if k != "SLURM_PROCID"}, "RANK": "0"}, "this srun task",
     "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not set"),
])
def test_an_exported_rank_says_where_and_why_in_full(environ: dict[str, str], where: str, seen: str) -> None:
    with pytest.raises(EnvError) as info:
        detect(environ, free_port=no_port)
    assert str(info.value) == (f"RANK=0 is set in {where} but Slurm never sets RANK, and {seen}: the job script "
                               "exports RANK (srun hands the batch shell's variables to every task, so all ranks get "
                               f"the same value). HINT: {_EXPORTED_HINT}")


def test_a_guessed_locality_says_so_for_any_world_of_two_or_more() -> None:
    env = detect({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
                 free_port=no_port)
    assert [str(w) for w in env.warnings] == [
        "RANK and WORLD_SIZE=2 are set but LOCAL_WORLD_SIZE is not, and no srun step says how many ranks run on this "
        "node: each rank takes the GPU of its LOCAL_RANK, and only the ranks on one node up to this one are known to "
        "share its GPUs. HINT: export LOCAL_WORLD_SIZE (ranks per node) with RANK and LOCAL_RANK, or start the ranks "
        "with torchrun, srun or `torchslurm run`."]
    assert detect({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
                  free_port=no_port).warnings == ()


@pytest.mark.parametrize(("changes", "warned"), [
    ({"SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1"}, True),
    ({"SLURM_NTASKS": "1", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2"}, True),
    ({"SLURM_NTASKS": None, "SLURM_NNODES": None, "SLURM_JOB_NUM_NODES": None}, False),  # one task, one node
    ({"SLURM_NTASKS": "1", "SLURM_NNODES": None, "SLURM_JOB_NUM_NODES": "2"}, True),
])
def test_a_batch_shell_warns_when_the_allocation_is_more_than_it(changes: dict[str, str | None],
                                                                  warned: bool) -> None:
    environ = {k: v for k, v in {**BATCH_SHELL, **changes}.items() if v is not None}
    assert bool(detect(environ, free_port=no_port).warnings) is warned


def test_the_torchrun_environ_of_a_placement_names_every_variable() -> None:
    assert detect(SRUN_TASK, free_port=no_port).torchrun_environ() == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "MASTER_ADDR": "node1", "MASTER_PORT": str(derived_port("4242", "0"))}


def test_ranks_set_by_hand_in_a_multi_node_batch_shell_are_not_taken_for_torchrun() -> None:
    """The idle-nodes warning is about torchrun started without srun; a step id without a task id is no srun task."""
    hand_set = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert detect({**BATCH_SHELL, **hand_set}, free_port=no_port).warnings == ()
    env = detect({**hand_set, "SLURM_STEP_ID": "0"}, free_port=no_port)
    assert (env.store_host, env.reason) == (None, "RANK set in the environment: RANK=0 of WORLD_SIZE=1, master h:1.")
