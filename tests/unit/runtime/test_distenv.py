"""distenv.detect on plain environment dicts, shaped like what srun/sbatch/torchrun really set."""

from __future__ import annotations

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
