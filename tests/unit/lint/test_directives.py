"""lint rules of the #SBATCH directives (lint/directives.py): what makes sbatch refuse a script."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchslurm.lint.directives import edit_distance
from torchslurm.lint.parse import parse
from torchslurm.lint.report import lint

FIXTURES = Path(__file__).parents[2] / "fixtures"
TORCHRUN = FIXTURES / "lint_torchrun"


@pytest.mark.parametrize(("directive", "message", "hint"), [
    ("--time=abc", "line 2: #SBATCH --time=abc is not a Slurm time limit; sbatch refuses the script.",
     "#SBATCH --time=1:30:00 (minutes, H:MM:SS or D-HH:MM:SS)."),
    ("--nodes=-1", "line 2: #SBATCH --nodes=-1 is not a node count; Slurm reads the leading `-` as a MIN-MAX "
     "range without MIN, i.e. 1 node.", "#SBATCH --nodes=2 (at least 1), or a range: --nodes=2-4."),
    ("-N 4-2", "line 2: #SBATCH --nodes=4-2 is not a node count; sbatch refuses the script.", "--nodes=2-4"),
    ("--ntasks=0", "line 2: #SBATCH --ntasks=0 is not a whole number of at least 1; sbatch refuses the script.",
     "#SBATCH --ntasks=4."),
    ("--ntasks-per-node 4x", "line 2: #SBATCH --ntasks-per-node=4x is not a whole number", "--ntasks-per-node=4"),
    ("-c -1", "line 2: #SBATCH --cpus-per-task=-1 is not a whole number", "#SBATCH --cpus-per-task=4."),
    ("--gpus-per-node=four", "line 2: #SBATCH --gpus-per-node=four is not a GPU count",
     "--gpus-per-node=4, or with a GPU type: --gpus-per-node=a100:4."),
])


def test_values_sbatch_refuses(directive: str, message: str, hint: str) -> None:
    (f,) = [f for f in lint(f"#!/bin/bash\n#SBATCH {directive}\nsrun -K python t.py\n") if f.code == "invalid-value"]
    assert f.severity == "error" and f.message.startswith(message) and hint in f.hint
    assert f"HINT: {f.hint}" in str(f)


@pytest.mark.parametrize("directive", ["--time=90", "--time=1-00:00:00", "--time=UNLIMITED", "-t 5:00",
                                       "--nodes=2-4", "-N1", "--ntasks=8", "--gpus-per-node=a100:4", "--gpus=0"])
def test_valid_values_pass(directive: str) -> None:
    assert [f for f in lint(f"#!/bin/bash\n#SBATCH {directive}\nsrun -K python t.py\n")
            if f.code == "invalid-value"] == []


def test_nodes_overridden_by_an_invalid_value_is_reported_on_its_line() -> None:
    found = lint("#!/bin/bash\n#SBATCH -N 4\n#SBATCH --nodes=-1\nsrun -K python t.py\n")
    assert [(f.code, f.message[:8]) for f in found] == [("invalid-value", "line 3: ")]


def test_no_directives_and_no_command_is_said() -> None:
    (f,) = lint("#!/bin/bash\necho hello\n")
    assert (f.severity, f.code) == ("warning", "no-directives")
    assert f.message.startswith("no #SBATCH directives and no srun, torchrun or python line found")
    assert "#SBATCH --nodes=2" in f.hint


def test_no_directives_with_a_command_is_a_note() -> None:
    (f,) = lint("#!/bin/bash\nsrun python t.py\n")
    assert (f.severity, f.code) == ("info", "no-directives") and "against Slurm's defaults" in f.message


def test_directive_after_the_first_command_is_ignored_by_sbatch() -> None:
    (f,) = lint("#!/bin/bash\n#SBATCH -N 1\necho hi\n#SBATCH --nodes=2\n")
    assert (f.code, f.message) == ("late-directive", "line 4: #SBATCH after the first command: sbatch ignores it.")


def test_misspelled_sbatch_option_is_refused_with_a_suggestion() -> None:
    (f,) = lint((TORCHRUN / "misspelled_option.sbatch").read_text())
    assert (f.severity, f.code) == ("error", "unknown-option")
    assert f.message == ("line 3: #SBATCH --nodse=2: sbatch has no option --nodse and refuses the script (`sbatch: "
                         "unrecognized option`; checked against sbatch 22.05's options).")
    assert f.hint == "did you mean --nodes? #SBATCH --nodes=2."


@pytest.mark.parametrize(("directive", "message", "hint"), [
    ("--cpus_per_task=8", "#SBATCH --cpus_per_task=8: sbatch has no option --cpus_per_task",
     "did you mean --cpus-per-task? #SBATCH --cpus-per-task=8."),
    ("--gpus-per-nod 4", "#SBATCH --gpus-per-node=4", None),  # a unique prefix: getopt_long takes it
    ("--requeu", "#SBATCH --requeue", None),
    ("--no=1", "#SBATCH --no=1: --no is ambiguous, the start of --no-kill, --no-requeue, --nodefile, --nodelist, "
     "--nodes; sbatch refuses the script.", "spell the option out, e.g. #SBATCH --no-kill=1."),
    ("--frobnicate", "#SBATCH --frobnicate: sbatch 22.05 has no option --frobnicate; unless this cluster's newer "
     "Slurm or a SPANK plugin", "check the spelling in `sbatch --help` (or `man sbatch`) on the login node."),
    ("--ntask-per-node=4", "#SBATCH --ntask-per-node=4: sbatch has no option", "did you mean --ntasks-per-node?"),
    # options of newer Slurm versions (24.05, 24.11) are no typos: a warning only
    ("--tres-bind=gres/gpu:closest", "#SBATCH --tres-bind=gres/gpu:closest: sbatch 22.05 has no option",
     "check the spelling"),
    ("--oom-kill-step", "#SBATCH --oom-kill-step: sbatch 22.05 has no option", "check the spelling"),
    ("--container-image=nvcr.io/nvidia/pytorch:24.01-py3", None, None),  # pyxis, a SPANK plugin
    ("-X 1", "#SBATCH -X 1: sbatch has no option -X", "check the letter in `sbatch --help`"),
    ("-N 2 -W", None, None), ("--open-mode=append --kill-on-invalid-dep=yes --hint=nomultithread", None, None),
])


def test_sbatch_options_checked_against_sbatchs_own_list(directive: str, message: str | None,
                                                         hint: str | None) -> None:
    found = [f for f in lint(f"#!/bin/bash\n#SBATCH {directive}\nsrun -K python t.py\n") if f.code == "unknown-option"]
    if hint is None:
        assert found == []
        if message:  # the abbreviation is read as the option it names
            key, _, value = message.removeprefix("#SBATCH --").partition("=")
            assert parse(f"#!/bin/bash\n#SBATCH {directive}\n").directives == {key: value}
    else:
        (f,) = found
        assert f.message.startswith(f"line 2: {message}") and f.hint.startswith(hint)
        assert f.severity == ("warning" if "SPANK" in f.message else "error")


@pytest.mark.parametrize(("a", "b", "edits"), [("nodse", "nodes", 1), ("ntask-per-node", "ntasks-per-node", 1),
                                               ("", "abc", 3), ("kitten", "sitting", 3), ("same", "same", 0)])
def test_edit_distance_counts_a_swap_as_one_edit(a: str, b: str, edits: int) -> None:
    assert edit_distance(a, b) == edits


def test_script_without_shebang_is_refused_by_sbatch() -> None:
    (f,) = lint((TORCHRUN / "no_shebang.sbatch").read_text())
    assert (f.severity, f.code) == ("error", "no-shebang")
    assert f.message == ("line 1 is `#SBATCH --nodes=2 --ntasks-per-node=1 --...`, not `#!` and an "
                         "interpreter: sbatch refuses the script (\"This does not look like a batch script\").")
    assert f.hint == "#!/bin/bash as the very first line."


@pytest.mark.parametrize(("text", "flagged"), [
    ("\n#!/bin/bash\nsrun python t.py\n", "line 1 is empty"), (" #!/bin/bash\nsrun python t.py\n", "line 1 is ` #!"),
    ("", "line 1 is empty"), ("#!/usr/bin/env python3\nprint(1)\n", None), ("#!/bin/sh\nsrun python t.py\n", None),
])


def test_shebang_must_be_the_first_two_bytes(text: str, flagged: str | None) -> None:
    found = [f.message for f in lint(text) if f.code == "no-shebang"]
    assert [m.startswith(flagged) for m in found] == ([True] if flagged else [])



def test_dos_line_breaks_are_an_error_as_sbatch_refuses_them() -> None:
    found = [f for f in lint("#!/bin/bash\n#SBATCH -N 1\r\nsrun -K python t.py\r\n") if f.code == "dos-line-breaks"]
    assert [(f.severity, f.message) for f in found] == [
        ("error", "line 2: this line ends in a DOS line break (\\r\\n): sbatch refuses a script with any (\"Batch "
                  "script contains DOS line breaks\").")]
    assert found[0].hint == "convert them to UNIX line breaks: dos2unix SCRIPT, or sed -i 's/\\r$//' SCRIPT."


@pytest.mark.parametrize("value", ["²", "٣"])
def test_counts_in_other_digits_are_not_numbers(value: str) -> None:
    """`²`.isdigit() is true and int('²') raises; `٣` is read by int() as 3, by sbatch not at all."""
    found = lint(f"#!/bin/bash\n#SBATCH --ntasks={value}\nsrun -K torchrun --nproc-per-node={value} t.py\n"
                 f"deepspeed --num_gpus={value} t.py\naccelerate launch --num_processes {value} t.py\n")
    assert [f.message for f in found if f.code == "invalid-value"] == [
        f"line 2: #SBATCH --ntasks={value} is not a whole number of at least 1; sbatch refuses the script."]


@pytest.mark.parametrize("directive", ["--nodes=2-2", "--time=-1", "--time=infinite", "--time=INFINITE",
                                       "--time=unlimited"])
def test_edge_values_sbatch_takes(directive: str) -> None:
    assert [f.code for f in lint(f"#!/bin/bash\n#SBATCH {directive}\nsrun python t.py\n")
            if f.code == "invalid-value"] == []


@pytest.mark.parametrize(("a", "b", "edits"), [
    ("abc", "ab", 1), ("ab", "abc", 1), ("ab", "ba", 1), ("ba", "ab", 1), ("abcd", "acbd", 1), ("ab", "b", 1),
    ("ba", "a", 1), ("abc", "bca", 2), ("xab", "xba", 1), ("abx", "bax", 1), ("aaa", "a", 2), ("aaaa", "a", 3),
])
def test_edit_distance_deletes_inserts_and_swaps_anywhere(a: str, b: str, edits: int) -> None:
    assert edit_distance(a, b) == edits
