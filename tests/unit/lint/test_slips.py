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
    ("export EXTRA=--opt= PATH", None),  # a value that ends in `=` is not an empty one
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


@pytest.mark.parametrize(("line", "builtin", "name", "value"), [
    ("export A= b", "export", "A", "b"),  # after export any word is meant as the value
    ("declare -x A= b", "declare", "A", "b"), ("declare -r -x A= b", "declare", "A", "b"),
    ("typeset -rx A= b", "typeset", "A", "b"), ("local A= INFO", "local", "A", "INFO"),
    ("export PREFIX+= /opt", "export", "PREFIX", "/opt"), ("A+= INFO", None, "A", "INFO"),
    ("declare A= b", None, None, None),  # not exported, and `b` may be a command run with A empty
])
def test_assign_space_after_a_builtin_says_what_the_builtin_does(line: str, builtin: str | None, name: str | None,
                                                                 value: str | None) -> None:
    found = [str(f) for f in lint(f"{H}#SBATCH -N 1\n{line}\n") if f.code == "assign-space"]
    if name is None:
        assert found == []
        return
    what = (f"`{builtin}` sets {name} to the empty string and takes `{value}` as the name of another variable "
            "(unless it is a valid name: \"not a valid identifier\"" if builtin else
            f"bash sets {name} to the empty string and runs `{value}` as a command (command not found")
    assert found == [f"error: [assign-space] line 3: `{name}= {value}` has a space after `=`: {what}; with `set -e` "
                     f"the script stops there). HINT: {name}={value} (no spaces around `=`)."]


@pytest.mark.parametrize(("directive", "one_dash"), [
    ("-export=ALL,A=1", "--export"), ("-nod=2", "--nod"), ("-ntasks=2", "--ntasks"),
    ("-no=2", None),  # two letters: `-n o=2`, the invalid-value rule's
    ("--nodes=2", None),
])
def test_one_dash_before_a_long_option_of_three_letters_or_more(directive: str, one_dash: str | None) -> None:
    found = [f.message for f in lint(f"{H}#SBATCH {directive}\nsrun python t.py\n") if f.code == "one-dash-option"]
    assert [m.endswith(f"not as {one_dash}.") for m in found] == ([True] if one_dash else [])
