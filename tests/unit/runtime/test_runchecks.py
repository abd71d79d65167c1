"""runtime.runchecks: what `torchslurm run` (and `submit`, for a job's script) refuses before any rank
starts, each refusal whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchslurm.errors import ConfigError
from torchslurm.runtime.runchecks import (
    check_run_options,
    data_file_kind,
    first_line,
    module_problem,
    nproc_problem,
    run_flags_after_script,
    script_problem,
    shell_script_kind,
)


def test_nproc_problem_is_the_one_rule() -> None:
    assert nproc_problem(None) is None and nproc_problem(1) is None
    problem = nproc_problem(-1)
    assert problem is not None
    assert (problem.message, problem.hint) == ("--nproc=-1 must be at least 1.", "--nproc 2 starts two ranks.")



def test_a_module_that_python_cannot_find_is_refused() -> None:
    assert module_problem("torchslurm.cli.doctor") is None
    problem = module_problem("torchslurm.no_such_module")
    assert problem is not None and problem.message == (
        "module 'torchslurm.no_such_module' cannot be imported here; expected a module that `python -m` can run.")
    with pytest.raises(ConfigError, match=r"module 'nope_pkg\.x' cannot be imported here"):
        check_run_options("nope_pkg.x", None, 0, module=True)



def test_script_problem_is_an_error_with_a_hint(tmp_path: Path) -> None:
    problem = script_problem(str(tmp_path / "none.py"))
    assert problem is not None and problem.hint == (
        "give the path of the training script, e.g. `torchslurm run --nproc 2 train.py`.")
    assert script_problem(__file__) is None



def test_max_restarts_below_zero_is_refused_whole_and_zero_is_taken(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    check_run_options(str(script), None, 0)
    with pytest.raises(ConfigError) as info:
        check_run_options(str(script), 2, -1)
    assert (info.value.message, info.value.hint) == (
        "--max-restarts=-1 must be at least 0.",
        "--max-restarts 0 (the default) fails on the first error; --max-restarts 3 restarts all ranks up to 3 times.")
    with pytest.raises(ConfigError, match=r"--nproc=0 must be at least 1"):
        check_run_options(str(script), 0, 0)
    with pytest.raises(ConfigError, match=r"script 'none.py' does not exist"):
        check_run_options("none.py", None, 0)
    check_run_options("torchslurm.cli.doctor", None, 0, module=True)



def test_a_module_python_cannot_find_is_refused_whole() -> None:
    for name in ("torchslurm.no_such_module", "", ".relative"):
        problem = module_problem(name)
        assert problem is not None and (problem.message, problem.hint) == (
            f"module {name!r} cannot be imported here; expected a module that `python -m` can run.",
            "give its dotted name as `python -m` takes it, with its package installed or under the current directory.")



def test_every_script_refusal_whole(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "runnable").mkdir()
    (tmp_path / "runnable" / "__main__.py").write_text("")
    (tmp_path / "job.YAML").write_text("nodes: 2\n")
    hint = "give the path of the training script, e.g. `torchslurm run --nproc 2 train.py`."
    cases = {str(tmp_path / "pkg"): "is a directory without __main__.py", "/dev/null": "is not a regular file",
             str(tmp_path / "none.py"): "does not exist"}
    for script, seen in cases.items():
        problem = script_problem(script)
        assert problem is not None and (problem.message, problem.hint) == (
            f"script {script!r} {seen}; expected a Python file.", hint)
    assert script_problem(str(tmp_path / "runnable")) is None
    spec = str(tmp_path / "job.YAML")
    problem = script_problem(spec)
    assert problem is not None and (problem.message, problem.hint) == (
        f"script {spec!r} is a YAML file, not a Python script: `python {spec}` would fail.",
        f"give the training script first and this file among its arguments, e.g. `torchslurm run --nproc 2 train.py "
        f"--config {spec}`.")
    assert [data_file_kind(n) for n in ("a.yml", "b.Json", "c.toml", "d.py", "e")] == ["YAML", "JSON", "TOML", None,
                                                                                       None]



@pytest.mark.parametrize(("script", "line", "kind"), [
    ("job.sh", "", "a .sh file"),
    ("dir/run.Slurm", "#!/usr/bin/env python3\n", "a .slurm file"),  # the name says it first
    ("job", "#!/bin/bash\n", "a shell script (#!/bin/bash)"),
    ("job", "#!/usr/bin/env bash\n", "a shell script (#!/usr/bin/env bash)"),
    ("job", "#!bash\n", "a shell script (#!bash)"),
    ("job", "#! /bin/sh -e\n", "a shell script (#! /bin/sh -e)"),
    ("job", "#!/usr/bin/env -S bash -l\n", "a shell script (#!/usr/bin/env -S bash -l)"),
    ("job", "#!/usr/bin/env LC_ALL=C zsh", "a shell script (#!/usr/bin/env LC_ALL=C zsh)"),
    ("train", "#!/usr/bin/env python3\n", None),
    ("train.py", "#!/bin/bash\n", None),  # a .py file is python's, whatever its first line says
    ("train", "# a comment\n", None),
    ("train", "#!\n", None),
    ("train", "#!/usr/bin/env\n", None),
    ("train", "#!/opt/bin/bashful\n", None),
    ("train", "", None),
])
def test_a_shell_script_is_told_by_its_name_or_its_first_line(script: str, line: str, kind: str | None) -> None:
    assert shell_script_kind(script, line) == kind



def test_a_shell_script_is_refused_as_the_script_and_read_only_for_its_first_line(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.write_text("#!/bin/bash\n" + "#SBATCH -N 2\n" * 1000)
    problem = script_problem(str(job))
    assert problem is not None and (problem.message, problem.hint) == (
        f"script {str(job)!r} is a shell script (#!/bin/bash), not a Python script: `python {job}` would fail.",
        f"give the Python training script (`torchslurm run --nproc 2 train.py`); a hand-written sbatch script is "
        f"submitted with `sbatch {job}` (check it first: `torchslurm lint {job}`).")
    assert first_line(job) == "#!/bin/bash\n"
    (tmp_path / "latin1").write_bytes(b"#!/bin/sh \xe9t\xe9\n")
    assert first_line(tmp_path / "latin1") == "#!/bin/sh \ufffdt\ufffd\n"  # not UTF-8: read, not refused
    assert first_line(tmp_path / "absent") == ""
    (tmp_path / "long").write_text("#!" + "x" * 500)
    assert first_line(tmp_path / "long") == "#!" + "x" * 198  # a binary without line breaks is not read whole
    (tmp_path / "pkg.sh").mkdir()
    (tmp_path / "pkg.sh" / "__main__.py").write_text("")
    assert script_problem(str(tmp_path / "pkg.sh")) is None  # a folder python runs, whatever its name


def test_runs_own_flags_after_the_script_are_found_once_each() -> None:
    assert run_flags_after_script(["--max-restarts", "1", "--nproc=2", "--nproc", "-nproc", "--dry", "--dry-run"]) == [
        "--max-restarts", "--nproc", "--dry-run"]
    assert run_flags_after_script(["--lr", "0.1", "nproc=2"]) == []
    assert run_flags_after_script(["--nproc=2"]) == ["--nproc"]

