"""lint rules of deepspeed and `accelerate launch` lines (lint/launchers.py)."""

from __future__ import annotations

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
