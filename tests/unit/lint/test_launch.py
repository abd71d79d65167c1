"""lint rules of the launch lines (lint/launch.py): ranks per node against GPUs, srun, --kill-on-bad-exit."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchslurm.lint.report import lint

FIXTURES = Path(__file__).parents[2] / "fixtures"

C10D = "--rdzv-backend=c10d --rdzv-endpoint=$h:$p"  # the rendezvous torchrun needs across nodes

GPU_JOB = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=4 --gpus-per-node=4\n"
TORCHRUN = FIXTURES / "lint_torchrun"


def test_tasks_vs_gpus_under_srun() -> None:
    text = "#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1\n#SBATCH --gpus-per-node=4\nsrun -K python train.py\n"
    assert [f.code for f in lint(text)] == ["tasks-vs-gpus"]


def test_nproc_vs_gpus_and_launcher_per_task() -> None:
    text = ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=4 --gres=gpu:a100:4\n"
            "srun --kill-on-bad-exit=1 torchrun --nproc_per_node=2 --nnodes=2 " + C10D + " train.py\n")
    assert {f.code for f in lint(text)} == {"launcher-per-task", "nproc-vs-gpus"}


@pytest.mark.parametrize(("srun", "tasks", "flagged"), [
    ("srun", "--ntasks=4", True), ("srun --kill-on-bad-exit=0", "--ntasks=4", True), ("srun -K0", "-N 2", True),
    ("srun --kill-on-bad-exit=1", "--ntasks=4", False), ("srun --kill-on-bad-exit", "--ntasks=4", False),
    ("srun -K", "-N 2", False), ("srun -K1 --label", "--ntasks=4", False),
    ("srun", "--ntasks=1", False),  # one rank: nobody waits for it
])


def test_srun_without_kill_on_bad_exit_leaves_the_survivors_waiting(srun: str, tasks: str, flagged: bool) -> None:
    text = f"#!/bin/bash\n#SBATCH {tasks}\n{srun} python train.py\n"
    found = [f for f in lint(text) if f.code == "no-kill-on-bad-exit"]
    assert bool(found) is flagged
    if found:
        assert found[0].message.startswith("line 3: srun without --kill-on-bad-exit") and "30 min" in found[0].message
        assert "srun --kill-on-bad-exit=1" in found[0].hint


def test_python_without_srun() -> None:
    text = "#!/bin/bash\n#SBATCH --ntasks=4\npython -u train.py\n"
    assert [f.code for f in lint(text)] == ["python-without-srun"]


@pytest.mark.parametrize("srun", ["srun --kill-on-bad-exit=1", "srun -K1", "srun --kill-on-bad-exit", "srun -K",
                                  "srun --label -K", "srun --ntasks-per-node 4 -K"])
@pytest.mark.parametrize("command", ['bash -c "python train.py"',
                                     'bash -c "cd /x && python train.py \\\n --lr 0.1"',
                                     "bash -c '\n  cd /x\n  python train.py --lr 0.1\n'",
                                     "python train.py --lr 0.1"])
def test_srun_wrapping_a_shell_keeps_its_options(srun: str, command: str) -> None:
    assert [str(f) for f in lint(f"{GPU_JOB}{srun} {command}\n")] == []


def test_srun_wrapping_a_shell_without_kill_on_bad_exit_still_warned() -> None:
    (f,) = lint(GPU_JOB + 'srun -K0 bash -c "cd /x && python train.py"\n')
    assert f.code == "no-kill-on-bad-exit" and f.message.startswith("line 3: srun without --kill-on-bad-exit")


def test_python_outside_the_srun_string_still_flagged() -> None:
    (f,) = lint(GPU_JOB + 'srun -K bash -c "echo start" && python train.py\n')
    assert f.code == "python-without-srun" and f.message.startswith("line 3: `python ...` runs once")


def test_srun_value_in_the_next_word_is_not_the_command() -> None:
    (f,) = lint(GPU_JOB + "srun --ntasks-per-node 4 python train.py\n")
    assert f.code == "no-kill-on-bad-exit"


@pytest.mark.parametrize("srun", ["srun -K --ntasks-per-node=1", "srun -K -n $SLURM_NNODES --ntasks-per-node=1",
                                  "srun -K --ntasks=2"])
def test_launcher_per_node_as_the_hint_says_is_clean(srun: str) -> None:
    assert lint(f"{GPU_JOB}{srun} torchrun --nproc-per-node=4 --nnodes=2 {C10D} train.py\n") == []


def test_srun_fewer_tasks_per_node_than_gpus_leaves_gpus_idle() -> None:
    (f,) = lint((TORCHRUN / "srun_fewer_tasks.sbatch").read_text())
    assert (f.severity, f.code) == ("warning", "srun-tasks-vs-gpus")
    assert f.message == ("line 4: srun --ntasks-per-node=1 starts 1 rank(s) per node, overriding #SBATCH's 4, and 3 "
                         "of the 4 GPU(s) per node stay idle.")
    assert f.hint == "srun --ntasks-per-node=4 (one rank per GPU), or drop --ntasks-per-node=1 to use the job's layout."


@pytest.mark.parametrize(("job", "srun", "found"), [
    ("--ntasks-per-node=4", "srun -K -n 2", [("warning", "srun-tasks-vs-gpus")]),
    ("--ntasks-per-node=4", "srun -K --ntasks-per-node=8", [("error", "srun-tasks-vs-gpus")]),
    ("--ntasks-per-node=1", "srun -K --ntasks-per-node=4", []),  # srun fixes the job's layout
    ("--ntasks-per-node=1", "srun -K", [("error", "tasks-vs-gpus")]),
    ("--ntasks-per-node=4", "srun -K --ntasks-per-node=$N", []),  # not literal: lint cannot count
    ("--ntasks-per-node=4", "srun -K -n 8", []),
])


def test_srun_layout_against_the_gpus(job: str, srun: str, found: list[tuple[str, str]]) -> None:
    text = f"#!/bin/bash\n#SBATCH --nodes=2 {job} --gpus-per-node=4\n{srun} python train.py\n"
    assert [(f.severity, f.code) for f in lint(text)] == found


def test_srun_ntasks_over_nodes_rounds_up_as_the_block_layout_fills_the_first_node() -> None:
    """srun -n 9 on 2 nodes puts 5 ranks on the first node's 4 GPUs, not 4 (9 // 2)."""
    text = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks=9 --gpus-per-node=4\nsrun -K -n 9 python train.py\n"
    [f] = lint(text)
    assert (f.severity, f.code) == ("error", "srun-tasks-vs-gpus")
    assert "srun --ntasks=9 starts 5 rank(s) per node on 4 GPU(s) per node" in f.message



@pytest.mark.parametrize("python", ["python -m torchtitan.train", "python3 -u -m pkg.train", "python -X faulthandler "
                                    "-m pkg.train", "python3 -OO -m sglang.launch_server --node-rank 0"])
def test_python_m_module_runs_without_srun_like_a_script(python: str) -> None:
    (f,) = lint(f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1\n{python} --lr 1\n")
    assert f.code == "python-without-srun" and f.message.startswith(f"line 3: `{python.split()[0]} ...` runs once")


@pytest.mark.parametrize("python", ["python -m pip install -e .", "python -c 'import torch'", "python --version",
                                    "python3 -m torch.utils.collect_env"])
def test_python_that_does_not_train_is_no_launch(python: str) -> None:
    assert lint(f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1\n{python}\n") == []


def test_srun_python_m_is_one_rank_per_task_against_the_gpus() -> None:
    found = lint("#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1 --gpus-per-node=4\nsrun -K python -m pkg.train\n")
    assert [f.code for f in found] == ["tasks-vs-gpus"]


@pytest.mark.parametrize("launch", ["colossalai run --nproc_per_node 4 t.py", "python -m torch.distributed.run "
                                    "--nproc-per-node=4 --nnodes=2 " + C10D + " t.py",
                                    "python -m accelerate.commands.launch --num_processes 8 --num_machines 2 "
                                    "--rdzv_backend c10d t.py", "python -m multiproc t.py",
                                    "python ./multiproc.py --nproc_per_node 4 t.py"])
def test_launchers_started_in_every_task_start_their_own_ranks(launch: str) -> None:
    assert "launcher-per-task" in {f.code for f in lint(GPU_JOB + f"srun -K {launch}\n")}


@pytest.mark.parametrize(("lines", "flagged"), [
    ("srun -K python t.py\n", True),
    ("srun -K bash -c 'python t.py'\n", True),
    ("srun -K -c 8 python t.py\n", False),
    ("srun -K --cpus-per-task=$SLURM_CPUS_PER_TASK python t.py\n", False),
    ("export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK\nsrun -K python t.py\n", False),
    ("SRUN_CPUS_PER_TASK=8 srun -K python t.py\n", False),
    ("python t.py\n", False),  # no srun: the batch shell has the job's CPUs
])
def test_srun_without_the_jobs_cpus_per_task(lines: str, flagged: bool) -> None:
    found = [f for f in lint("#!/bin/bash\n#SBATCH --ntasks=1 --cpus-per-task=8\n" + lines)
             if f.code == "srun-cpus-per-task"]
    assert bool(found) is flagged
    if found:
        assert found[0].severity == "warning" and "Slurm 22.05" in found[0].message
        assert found[0].hint.startswith("export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK before srun, or srun -c")


def test_one_cpu_per_task_needs_nothing() -> None:
    assert lint("#!/bin/bash\n#SBATCH --ntasks=1 --cpus-per-task=1\nsrun -K python t.py\n") == []


def test_ntasks_over_nodes_in_the_directives_counts_the_fullest_node_against_the_gpus() -> None:
    """`#SBATCH --ntasks=9 --nodes=2`: Slurm's block layout puts 5 tasks on the first node, 4 on the second."""
    text = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks=9 --gpus-per-node=4\nsrun -K python t.py\n"
    (found,) = [f for f in lint(text) if f.code == "tasks-vs-gpus"]
    assert found.message == "line 3: srun runs one rank per task: 5 task(s) per node but 4 GPU(s) per node."
    text = "#!/bin/bash\n#SBATCH --nodes=2 --gpus=8\nsrun -K python t.py\n"
    (found,) = [f for f in lint(text) if f.code == "tasks-vs-gpus"]
    assert found.message == "line 3: srun runs one rank per task: 1 task(s) per node but 4 GPU(s) per node."


@pytest.mark.parametrize(("lines", "flagged"), [
    ("srun -K apptainer exec img.sif python t.py\n", "apptainer"),
    ("srun -K /usr/bin/singularity --quiet exec -B /d img.sif python t.py\n", "singularity"),
    ("srun -K env A=1 apptainer exec img.sif torchrun --nproc-per-node=4 t.py\n", "apptainer"),
    ("srun -K bash -c 'apptainer exec img.sif python t.py'\n", "apptainer"),
    ("srun -K apptainer exec img.sif bash -c 'python t.py'\n", "apptainer"),
    ("srun -K apptainer exec --nv img.sif bash -c 'python t.py'\n", None),
    ("srun -K apptainer exec --nv img.sif python t.py\n", None),
    ("srun -K apptainer exec --nvccli img.sif python t.py\n", None),
    ("srun -K singularity exec --rocm img.sif python t.py\n", None),
    ("export APPTAINER_NV=1\nsrun -K apptainer exec img.sif python t.py\n", None),
    ("SINGULARITY_NV=1 srun -K singularity exec img.sif python t.py\n", None),
    ("srun -K python t.py\n", None),
])
def test_a_gpu_jobs_training_in_a_container_needs_nv(lines: str, flagged: str | None) -> None:
    found = [f for f in lint("#!/bin/bash\n#SBATCH --nodes=1 --ntasks-per-node=4 --gpus-per-node=4\n" + lines)
             if f.code == "container-without-gpus"]
    assert [(f.severity, f.message, f.hint) for f in found] == ([] if flagged is None else [(
        "warning", f"line {lines.count(chr(10)) + 2}: the training runs in {flagged} without --nv: on NVIDIA GPUs "
        "the container sees none of the 4 per node, so the ranks find no CUDA device (or train on the CPU); AMD GPUs "
        "need no flag.", f"{flagged} exec --nv IMAGE ... (or export APPTAINER_NV=1 before srun); on AMD GPUs, --rocm "
        "or nothing")])


def test_a_cpu_job_in_a_container_needs_no_nv() -> None:
    script = "#!/bin/bash\n#SBATCH --nodes=1 --ntasks=2\nsrun -K apptainer exec img.sif python t.py\n"
    assert not [f for f in lint(script) if f.code == "container-without-gpus"]

