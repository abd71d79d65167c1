"""A Slurm job's Trainer leaves a pointer to its run_dir that `torchslurm status JOB` reads back."""

from __future__ import annotations

from pathlib import Path

from torchslurm.jobs.rundir import job_of, pointer_path, recall, remember


def test_a_job_remembers_its_run_dir_and_status_recalls_it(tmp_path: Path) -> None:
    environ = {"HOME": str(tmp_path / "home"), "SLURM_JOB_ID": "4242"}
    run_dir = tmp_path / "runs with space" / "x"
    written = remember(run_dir, environ)
    assert written == tmp_path / "home" / ".torchslurm" / "jobs" / "4242" / "run_dir"  # beside `stacks`' files
    assert recall("4242", {"HOME": str(tmp_path / "home")}) == run_dir.resolve()
    assert recall("4243", {"HOME": str(tmp_path / "home")}) is None


def test_array_tasks_are_keyed_by_task(tmp_path: Path) -> None:
    environ = {"HOME": str(tmp_path), "SLURM_JOB_ID": "101", "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": "1"}
    assert job_of(environ) == "100_1"
    assert remember(tmp_path / "r", environ) == tmp_path / ".torchslurm" / "jobs" / "100_1" / "run_dir"
    assert recall("100_1", {"HOME": str(tmp_path)}) == (tmp_path / "r").resolve()


def test_outside_slurm_or_without_a_home_nothing_is_written(tmp_path: Path) -> None:
    assert remember(tmp_path / "r", {"HOME": str(tmp_path)}) is None
    assert not (tmp_path / ".torchslurm").exists()
    assert pointer_path("7", {}) is None and remember(tmp_path / "r", {"SLURM_JOB_ID": "7"}) is None
    assert remember(tmp_path / "r", {"HOME": str(tmp_path), "SLURM_JOB_ID": "../7"}) is None


def test_an_unwritable_job_folder_is_not_an_error(tmp_path: Path) -> None:
    (tmp_path / ".torchslurm").write_text("not a directory")
    assert remember(tmp_path / "r", {"HOME": str(tmp_path), "SLURM_JOB_ID": "7"}) is None
