"""lint(): every pitfall the seeds' scripts carry is flagged; our own rendered scripts are clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchslurm.jobspec import JobSpec
from torchslurm.lint import gpus_per_node, lint, logical_lines, parse, tasks_per_node
from torchslurm.sbatch import render

FIXTURES = Path(__file__).parent.parent / "fixtures"
SEEDS = FIXTURES / "seed_scripts"

# What each seed script gets wrong, by the seed's own text (see the fixture headers).
EXPECTED = {
    "seed000_pytorch_distributed.sbatch": {"hard-coded-master-addr", "fixed-master-port", "batch-shell-rank",
                                           "no-kill-on-bad-exit"},
    "seed002_run_distributed.slurm": {"fixed-port", "log-dir", "no-kill-on-bad-exit"},
    "seed003_ex1_single_gpu.sbatch": {"launcher-without-srun", "deprecated-launch"},
    "seed003_ex2_multi_gpu.sbatch": {"ntasks-mismatch", "launcher-without-srun", "deprecated-launch"},
    "seed003_ex3_process_split.sbatch": {"launcher-without-srun", "deprecated-launch"},
    "seed004_run_nccl.slurm": {"hard-coded-master-addr", "fixed-master-port", "per-rank-nic",
                               "nccl-ib-disabled", "no-kill-on-bad-exit"},
    "lab_signal_batch_only.sbatch": {"signal-unreachable", "export-none-bare-python", "signal-without-requeue",
                                     "no-kill-on-bad-exit"},
    "lab_torchrun_signal.sbatch": {"signal-kills-torchrun", "no-kill-on-bad-exit"},
}


def test_every_fixture_has_expectations() -> None:
    assert sorted(p.name for p in SEEDS.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_seed_script_pitfalls(name: str) -> None:
    found = lint((SEEDS / name).read_text(), path_exists=lambda p: False)
    assert {f.code for f in found} == EXPECTED[name]
    assert all("HINT" not in f.message and f.hint for f in found)


@pytest.mark.parametrize("golden", sorted((FIXTURES / "golden").glob("*.sbatch")), ids=lambda p: p.stem)
def test_rendered_scripts_lint_clean(golden: Path) -> None:
    assert [str(f) for f in lint(golden.read_text(), path_exists=lambda p: True)] == []


def test_rendered_preemptible_torchrun_not_flagged_for_signal() -> None:
    spec = JobSpec(script="t.py", nodes=2, launch="torchrun", nproc_per_node=2, cpus_per_task=2,
                   preemptible=True, signal="USR1", time="60")
    assert lint(render(spec)) == []


def test_messages_name_the_line_and_value() -> None:
    (f,) = [f for f in lint((SEEDS / "seed000_pytorch_distributed.sbatch").read_text())
            if f.code == "fixed-master-port"]
    assert f.message.startswith("line 17: MASTER_PORT=12355 is fixed")
    assert "derives the port from SLURM_JOB_ID" in f.hint


def test_tasks_vs_gpus_under_srun() -> None:
    text = "#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1\n#SBATCH --gpus-per-node=4\nsrun -K python train.py\n"
    assert [f.code for f in lint(text)] == ["tasks-vs-gpus"]


def test_nproc_vs_gpus_and_launcher_per_task() -> None:
    text = ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=4 --gres=gpu:a100:4\n"
            "srun --kill-on-bad-exit=1 torchrun --nproc_per_node=2 train.py\n")
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


def test_directives_after_first_command_are_ignored_like_sbatch() -> None:
    script = parse("#!/bin/bash\n#SBATCH --nodes=2\necho hi\n#SBATCH --nodes=8\n")
    assert script.directives == {"nodes": "2"}


def test_continuations_and_quoted_multiline_joined() -> None:
    lines = logical_lines("srun \\\n  python a.py\nbash -c '\necho 1\n'\nls\n")
    assert [n for n, _ in lines] == [1, 3, 6]


@pytest.mark.parametrize(("directives", "gpus", "tasks"), [
    ({"gres": "gpu:4"}, 4, None), ({"gres": "gpu:a100:2,tmp:10G"}, 2, None), ({"gpus-per-node": "8"}, 8, None),
    ({"gpus-per-task": "1", "ntasks-per-node": "4"}, 4, 4), ({"gpus": "8", "nodes": "2"}, 4, None),
    ({"ntasks": "16", "nodes": "4"}, None, 4),
])
def test_resource_reading(directives: dict[str, str], gpus: int | None, tasks: int | None) -> None:
    assert (gpus_per_node(directives), tasks_per_node(directives)) == (gpus, tasks)


def test_log_dir_checked_with_path_exists() -> None:
    text = "#!/bin/bash\n#SBATCH --output=logs/%j.out\nsrun python t.py\n"
    assert [f.code for f in lint(text, path_exists=lambda p: p != "logs")] == ["log-dir"]
    assert lint(text, path_exists=lambda p: True) == []
