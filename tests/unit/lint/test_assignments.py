"""Variables and arrays as the batch shell sets them (`NAME=`, `NAME+=`, `NAME=(...)`, `export`, `declare -x`), and
what a later `$NAME` on a launch line becomes."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from torchslurm.lint.parse import parse
from torchslurm.lint.shell import MAX_VALUE


def _args(setup: str, args: str) -> list[str]:
    """The words after `python t.py` of a launch line run after `setup`."""
    (launch,) = parse(f"#!/bin/bash\n{setup}\nsrun -K python t.py {args}\n").launches
    return launch.words[4:]


@pytest.mark.parametrize(("setup", "args", "words"), [
    ("A=(--nnodes 2)", "$A", ["--nnodes"]),                  # an array's `$NAME` is its first element
    ("A=(--nnodes 2)\nA+=(--nproc-per-node 4)", "$A ${A[@]}", ["--nnodes", "--nnodes", "2", "--nproc-per-node", "4"]),
    ("A=()", "x$A", ["x"]),
    ("A=(a b)\nX=\"${A[@]}\"", "$X", ["a", "b"]),
    ("B='x  y'\nA=$B", '"$A"', ["x  y"]),                   # an assignment's value is not split
    ("A=1 B=2", "$A $B", ["1", "2"]),
    ("ARGS=--lr\nARGS+=' 1'", "$ARGS", ["--lr", "1"]),       # `+=` appends
    ("ARGS+=--lr", '"$ARGS"', ["${ARGS}--lr"]),             # what the environment gave it: unknown
    ('PYTHONPATH+=":$HOME/src"', '"$PYTHONPATH"', ["${PYTHONPATH}:$HOME/src"]),  # to a value lint cannot know
    ("A=(a)\nAB=(b)", '"${AB[@]}"', ["b"]), ("A=(a)\nA=(b)", '"${A[@]}"', ["b"]),
    ("A+=(x)", '"${A[@]}"', ["x"]),
    ("eval X=1", "$X", ["1"]),                               # eval's code runs in the shell that reads it
    ("srun bash -c 'X=1; B=(x)'", '$X "${B[@]}"', ["$X", "${B[@]}"]),  # a child shell's variables stay there
    ("bash -c 'X=1'", "$X", ["$X"]),
])
def test_a_launch_line_sees_what_the_lines_before_set(setup: str, args: str, words: list[str]) -> None:
    assert _args(setup, args) == words
    if shutil.which("bash") is not None and "srun" not in setup and not any("$" in w for w in words):
        code = f"{setup}\nset -- {args}\nprintf '%s\\0' \"$@\""
        done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30, check=True)
        assert done.stdout.split("\0")[:-1] == words


def test_the_exports_record_the_value_each_name_holds() -> None:
    script = parse("A=(--nnodes 2)\nX=\"${A[@]}\"\nPORT=29500\nPORT+=1\nNCCL_DEBUG=INFO srun -K python t.py\n")
    assert script.exports == {"A": (1, "--nnodes"), "X": (2, "--nnodes 2"), "PORT": (4, "295001"),
                              "NCCL_DEBUG": (5, "INFO")}
    (launch,) = script.launches
    assert (launch.env, launch.under_srun, launch.words) == ({"NCCL_DEBUG"}, True, ["srun", "-K", "python", "t.py"])


@pytest.mark.parametrize(("line", "exported"), [
    ("export A=1 B", {"A", "B"}), ("export A B=2", {"A", "B"}), ("declare -x A=1", {"A"}), ("declare -rx A=1", {"A"}),
    ("declare -r -x A=1", {"A"}), ("typeset -x A=1", {"A"}), ("local -x A=1", {"A"}), ("declare A=1", set()),
    ("readonly A=1", set()), ("declare -i A=1", set()), ("declare", set()), ("declare -x", set()),
    ("export -p", set()), ("export A+", set()),
])
def test_the_names_exported_are_those_export_and_declare_x_mark(line: str, exported: set[str]) -> None:
    script = parse(f"#!/bin/bash\n{line}\n")
    assert script.exported == exported
    assert script.exports == ({"A": (2, "1")} if "A=1" in line else {"B": (2, "2")} if "B=2" in line else {})


def test_variables_set_in_each_task_are_apart_from_the_batch_shell() -> None:
    script = parse("#!/bin/bash\nexport P=1\nsrun bash -c 'export X=2; python t.py'\nbash -c 'Y=3'\n")
    assert (script.exports, script.task_exports) == ({"P": (2, "1"), "Y": (4, "3")}, {"X": (3, "2")})
    assert script.exported == {"P", "X"}
    assert [(c.text, c.per_task) for c in script.commands] == [
        ("export P=1", False), ("srun bash -c 'export X=2; python t.py'", False), ("export X=2", True),
        ("python t.py", True), ("bash -c 'Y=3'", False), ("Y=3", False)]


def test_a_value_of_the_longest_length_is_expanded_a_longer_one_stays_as_written() -> None:
    longest, longer = "y" * MAX_VALUE, "y" * (MAX_VALUE + 1)
    assert _args(f"A={longest}", "$A") == [longest]
    assert _args(f"A={longer}", "$A ${A:-x} ${A}") == ["$A", "${A:-x}", "${A}"]  # set, but too long to show
    assert parse(f"A={longer}\n").exports == {"A": (1, longest)}


def test_an_array_of_more_elements_than_the_limit_is_not_known() -> None:
    most, more = "(" + "x=1 " * MAX_VALUE + ")", "(" + "x=1 " * (MAX_VALUE + 1) + ")"
    assert _args(f"A={most}", "$A") == ["x=1"]
    assert _args(f"A={more}", '$A "${A[@]}"') == ["$A", "${A[@]}"]
    assert _args(f"A={more}\nA+=(y)", '$A "${A[@]}"') == ["$A", "${A[@]}"]
    assert parse(f"A={more}\n").exports["A"] == (1, more[:MAX_VALUE])
