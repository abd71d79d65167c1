"""`torchslurm stacks`: a responder running in this process answers; folders nobody watches are errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchslurm.cli import main
from torchslurm.cli.stacks import folder_of
from torchslurm.errors import ConfigError
from torchslurm.runtime.stackwatch import StackWatch, job_dir


def test_stacks_of_a_run_dir_groups_the_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    watches = [StackWatch(rank, 3, poll_s=0.05) for rank in range(2)]  # rank 2 never registered: it is missing
    for watch in watches:
        watch.add(tmp_path)
        watch.start()
    try:
        code = main(["stacks", "--run-dir", str(tmp_path), "--wait", "1"])
    finally:
        for watch in watches:
            watch.stop()
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith(f"{tmp_path}: 2 of 3 rank(s) answered in ")
    # the ranks here are threads of this process, each answering with its main thread's stack at the moment
    # it looks: where in the command that is (and so whether the two group as one) depends on the machine's load
    assert re.search(r"^  ranks? 0(-1)?: ", out, re.M) and re.search(r"^  ranks? (0-)?1: ", out, re.M), out
    assert "rank 2: no answer" in out


def test_a_folder_nobody_watches_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stacks", "--run-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--run-dir {tmp_path}: no rank watches it" in err and "HINT: pass the run_dir of a running Trainer" in err


def test_a_job_is_found_in_the_home_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no rank of job 77 is registered in .*jobs/77: the job is not running"):
        folder_of("77", None, tmp_path)
    StackWatch(0, 1).add(job_dir("77", tmp_path))
    assert folder_of("77", None, tmp_path) == job_dir("77", tmp_path)


def test_job_and_run_dir_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="2"):
        main(["stacks", "12", "--run-dir", "x"])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("job", ["12x", "../../etc", "77/.."])
def test_a_job_id_that_is_not_one_is_refused_before_any_folder_is_read(
        job: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for reached in (tmp_path / "etc", tmp_path / ".torchslurm" / "jobs"):  # watched folders `..` would reach
        StackWatch(0, 1).add(reached)
    assert main(["stacks", job, "--wait", "0.1"]) == 2
    err = capsys.readouterr().err
    assert f"job id {job!r} is not a Slurm job id" in err and "HINT: `torchslurm status` lists your jobs" in err
