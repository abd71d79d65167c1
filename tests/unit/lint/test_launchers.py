"""lint rules of deepspeed and `accelerate launch` lines (lint/launchers.py)."""

from __future__ import annotations

import pytest

from torchslurm.lint.report import lint

TWO_NODES = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=4\n"


def test_deepspeed_on_fewer_nodes_than_the_job_leaves_nodes_idle() -> None:
    (f,) = lint(TWO_NODES + "deepspeed --num_nodes=1 --num_gpus=4 t.py\n")
    assert f.message == "line 3: deepspeed --num_nodes=1 but the job has 2 node(s): 1 of the 2 nodes stay idle."
    assert f.hint == "--num_nodes=$SLURM_NNODES."


def test_accelerate_counts_the_processes_of_all_machines() -> None:
    found = [f for f in lint(TWO_NODES + "srun -K accelerate launch --num_machines 2 --num_processes 16 "
                             "--rdzv_backend c10d t.py\n") if f.code == "launcher-processes"]
    assert [f.message.endswith("ranks wait for processes that never come.") for f in found] == [True]
    assert found[0].hint == "--num_processes=$((SLURM_NNODES * 4))."


def test_accelerate_machine_rank_expanded_by_each_task_is_right() -> None:
    launch = "accelerate launch --num_machines 2 --num_processes 8 --machine_rank $SLURM_NODEID t.py"
    assert "launcher-node-rank" in {f.code for f in lint(TWO_NODES + f"srun -K {launch}\n")}
    assert "launcher-node-rank" not in {f.code for f in lint(TWO_NODES + f"srun -K bash -c '{launch}'\n")}


def test_accelerate_machine_rank_with_c10d_or_a_config_file_is_no_error() -> None:
    rank = "srun -K accelerate launch --num_machines 2 --num_processes 8 --machine_rank $SLURM_PROCID"
    c10d = [(f.severity, f.code) for f in lint(TWO_NODES + f"{rank} --rdzv_backend c10d t.py\n")]
    config = [(f.severity, f.code) for f in lint(TWO_NODES + f"{rank} --config_file fsdp.yaml t.py\n")]
    static = [(f.severity, f.code) for f in lint(TWO_NODES + f"{rank} t.py\n")]
    assert "error" not in {s for s, _ in c10d}  # c10d ignores the machine rank
    assert ("warning", "launcher-node-rank") in config and "error" not in {s for s, _ in config}
    assert ("error", "launcher-node-rank") in static


@pytest.mark.parametrize("launch", [
    "srun -K deepspeed --hostfile hf --num_gpus 4 t.py",
    "srun -K deepspeed --num_nodes 2 --num_gpus 4 t.py",  # its default hostfile, /job/hostfile
    "srun -K python deepy.py train.py configs/125M.yml",
    "srun -K colossalai run --hostfile hf --nproc_per_node 4 t.py",
    "srun -K colossalai run --nproc_per_node 4 t.py",  # no hostfile: one training per node
])
def test_a_launcher_that_reaches_the_nodes_itself_started_in_every_task(launch: str) -> None:
    found = [f for f in lint(TWO_NODES + launch + "\n") if f.code == "ssh-launcher-under-srun"]
    assert [f.message.startswith("line 3: srun starts ") and "in each of its 2 tasks" in f.message
            for f in found] == [True]


@pytest.mark.parametrize("launch", [
    "deepspeed --hostfile hf --num_nodes 2 --num_gpus 4 t.py",  # once, in the batch shell: right
    "srun -K -N1 -n1 deepspeed --hostfile hf --num_nodes 2 --num_gpus 4 t.py",
    "srun -K deepspeed --no_ssh --node_rank=$SLURM_NODEID --num_gpus 4 t.py",
    "python deepy.py train.py configs/125M.yml",
])
def test_a_launcher_that_reaches_the_nodes_itself_run_once(launch: str) -> None:
    assert "ssh-launcher-under-srun" not in {f.code for f in lint(TWO_NODES + launch + "\n")}


def test_several_launchers_per_node_are_launcher_per_task_first() -> None:
    text = "#!/bin/bash\n#SBATCH --nodes=1 --ntasks-per-node=4 --gpus-per-node=4\nsrun -K colossalai run " \
           "--nproc_per_node 4 t.py\n"
    assert {f.code for f in lint(text) if f.severity == "error"} == {"launcher-per-task"}


def test_a_launcher_in_a_one_node_step_of_a_two_node_job_spans_the_step() -> None:
    launch = "srun -K -N 1 -n 1 accelerate launch --num_machines 1 --num_processes 4 t.py\n"
    assert "launcher-nodes" not in {f.code for f in lint(TWO_NODES + launch)}
    (found,) = [f for f in lint(TWO_NODES + launch.replace("-N 1 -n 1 ", "")) if f.code == "launcher-nodes"]
    assert found.message == ("line 3: accelerate --num_machines=1 but the job has 2 node(s): 1 of the 2 nodes stay "
                             "idle.")
