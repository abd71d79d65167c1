"""lint rules of shell slips (lint/slips.py): `VAR= value`, directives sbatch skips, one-dash long options."""

from __future__ import annotations

import pytest

from torchslurm.lint.report import lint

H = "#!/bin/bash\n"


@pytest.mark.parametrize(("line", "flagged"), [
    ("NCCL_DEBUG= INFO", "line 3: `NCCL_DEBUG= INFO` has a space after `=`"),
    ("export OMP_NUM_THREADS= 8", "line 3: `OMP_NUM_THREADS= 8` has a space"),  # export: always a value
    ("CUDA_VISIBLE_DEVICES= python t.py", None),  # an empty variable for one command: on purpose
    ("X=1 Y= $Z", "line 3: `Y= $Z`"),
])
def test_assign_space(line: str, flagged: str | None) -> None:
    found = [f.message for f in lint(f"{H}#SBATCH -N 1\n{line}\n") if f.code == "assign-space"]
    assert [m.startswith(flagged) for m in found] == ([True] if flagged else [])


@pytest.mark.parametrize(("header", "severity"), [
    ("# SBATCH --nodes=2\n", "error"),  # a layout option lost: the job runs with the default
    ("  #SBATCH --job-name=x\n", "info"),
    ("# SBATCH --nodes=2\n#SBATCH --nodes=2\n", None),  # a working directive sets it
])
def test_ignored_directive(header: str, severity: str | None) -> None:
    found = [f for f in lint(H + header + "srun python t.py\n") if f.code == "ignored-directive"]
    assert [f.severity for f in found] == ([severity] if severity else [])
    if found:
        assert found[0].hint.startswith("write it at the start of the line: #SBATCH --")


def test_one_dash_option_says_how_getopt_reads_it() -> None:
    (f,) = lint(H + "#SBATCH -nodes=3\nsrun python t.py\n")
    assert f.message == ("line 2: #SBATCH -nodes=3 has one dash: sbatch reads it as the short option -n with the "
                         "value `odes=3` (`-n odes=3`), not as --nodes.")
    assert f.hint == "two dashes: #SBATCH --nodes=3."


def test_directives_after_the_first_command_are_not_slips() -> None:
    assert [f.code for f in lint(H + "#SBATCH -N 1\necho hi\n# SBATCH --nodes=2\n#SBATCH -nodes=3\n")] == [
        "late-directive"]


def test_code_nested_deeper_than_lint_reads_is_reported_not_a_recursion_error() -> None:
    (f,) = [f for f in lint("#!/bin/bash\n#SBATCH -N 1\n" + "eval " * 1000 + "srun -K python t.py\n")]
    assert (f.severity, f.code) == ("warning", "unread-lines")
    assert f.message == ("line 3 runs code inside code (`eval`, `bash -c`) more than 16 levels deep; lint reads no "
                         "deeper, so the innermost code was not checked.")
