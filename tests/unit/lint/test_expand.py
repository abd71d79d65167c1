"""The fields one word becomes, as bash makes them: quotes, escapes, `$'...'`, defaults, arrays and splitting.

Where lint knows every value a word reads, the fields are checked against bash itself (`set -- WORD`)."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from torchslurm.lint.shell import MAX_NESTING, MAX_VALUE, expand, expand_joined

VARIABLES = {"NODES": "2", "nodes": "4", "MSG": "a b", "SPACED": "x  y", "LEAD": " a b", "TRAIL": "ab ", "EMPTY": "",
             "TAG": "aXb", "H": "$(hostname -s) x", "B": "`hostname -s` x", "K": "x $(hostname -s)"}
COUNTS = {"SLURM_NNODES": "4"}
ARRAYS: dict[str, list[str] | None] = {"A": ["a", "b c"], "E": []}


def _lookup(name: str, arithmetic: bool) -> str | None:
    """The shell's variables, and Slurm's counts in `$(( ))` only (as the batch shell's lookup gives them)."""
    return VARIABLES.get(name, COUNTS.get(name) if arithmetic else None)


def _bash_fields(word: str) -> list[str]:
    """The fields bash makes of `word`, with VARIABLES and ARRAYS set and no globbing."""
    setup = "".join(f"{k}={shlex.quote(v)}; " for k, v in VARIABLES.items() if not v.count("`") + v.count("$("))
    setup += "".join(f"{k}=({' '.join(map(shlex.quote, v or []))}); " for k, v in ARRAYS.items())
    code = f"set -f; {setup}set -- {word}; for f in \"$@\"; do printf '%s\\0' \"$f\"; done"
    done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.split("\0")[:-1]


AS_BASH = [  # (word, fields): lint knows all it reads, so bash makes the same fields
    ('"\\$NODES"', ["$NODES"]),                      # an escaped `$` is a `$`, the name after it text
    ('"a\\"b"', ['a"b']), ('"a\\\\b"', ["a\\b"]), ('"\\`x\\`"', ["`x`"]),
    ('"C:\\dir"', ["C:\\dir"]),                      # a backslash before anything else stays
    ('"MAX X/$NODES"', ["MAX X/2"]), ("${NODES}X", ["2X"]), ("${NODES}X/", ["2X/"]),
    ("$'a\\tb'", ["a\tb"]), ("$'a\\nb'", ["a\nb"]), ("$'it\\'s'", ["it's"]), ("--sep=$'\\t'", ["--sep=\t"]),
    ("$''", [""]), ("''", [""]), ('""', [""]), ("$EMPTY", []), ('"$EMPTY"', [""]), ("x$EMPTY", ["x"]),
    ("a\\ b", ["a b"]), ("e\\f", ["ef"]),
    ("pre$LEAD", ["pre", "a", "b"]), ("x'y'$LEAD", ["xy", "a", "b"]), ("$MSG\"x\"", ["a", "bx"]),
    ("$TRAIL\"x\"", ["ab", "x"]), ("y$MSG", ["ya", "b"]), ("$TAG", ["aXb"]), ("$SPACED", ["x", "y"]),
    ('x"${A[@]}"', ["xa", "b c"]), ('"${A[@]}"y', ["a", "b cy"]), ("${A[@]}", ["a", "b", "c"]),
    ('"${A[*]}"', ["a b c"]), ('"${E[@]}"', []), ('x"${E[@]}"', ["x"]),
    ("$((nodes * 2))", ["8"]), ("$(( $NODES * 2 ))", ["4"]), ("$((NODES+nodes))", ["6"]),
    ("${nodes:-1}", ["4"]), ("${NODES:-1}", ["2"]), ("${NODES-1}", ["2"]), ("${MSG}", ["a", "b"]),
    ("${UNSET:-}", []), ("${UNSET:-a b}", ["a", "b"]), ('"${UNSET:-$SPACED}"', ["x  y"]),
    ('"${UNSET:-a\nb}"', ["a\nb"]), ("${UNSET-x}y", ["xy"]),
    ("a$", ["a$"]), ("$/x", ["$/x"]), ('"a$ b"', ["a$ b"]), ('"$"', ["$"]),
    ("--nodes=${NODES}", ["--nodes=2"]),
]


@pytest.mark.parametrize(("word", "fields"), AS_BASH)
def test_fields_are_those_bash_makes(word: str, fields: list[str]) -> None:
    assert expand(word, _lookup, arrays=ARRAYS) == fields
    if shutil.which("bash") is not None:
        assert _bash_fields(word) == fields


@pytest.mark.parametrize(("word", "fields"), [
    ("${UNSET}", ["${UNSET}"]), ("$UNSET", ["$UNSET"]),      # set or not, lint cannot know: kept for run time
    ("${SLURM_NNODES:-1}", ["${SLURM_NNODES:-1}"]),          # Slurm sets its own variables at run time
    ("${SLURM_JOB_NAME:-my job}", ["${SLURM_JOB_NAME:-my job}"]),
    ("${SLURM_NNODES}", ["${SLURM_NNODES}"]), ("$SLURM_NNODES", ["$SLURM_NNODES"]),  # known in $(( )) only
    ("$((SLURM_NNODES * 2))", ["8"]),
    ("${MSG// /,}", ["${MSG// /,}"]),                          # other forms stay one word, as written
    ('"${B[@]}"', ["${B[@]}"]), ("${B[@]}", ["${B[@]}"]),      # no array B
    ("$$", ["$$"]), ("$${NODES}", ["$${NODES}"]), ("ab$${NODES}", ["ab$${NODES}"]),  # specials: run time
    ("$1$#", ["$1$#"]), ('"$@"', ["$@"]),
    ("$H", ["$(hostname -s)", "x"]), ("$B", ["`hostname -s`", "x"]), ("$K", ["x", "$(hostname -s)"]),
    ("$(( NODES * UNKNOWN ))", ["$(( NODES * UNKNOWN ))"]), ("$(echo $((1+2)))", ["$(echo $((1+2)))"]),
    ("'abc", ["abc"]), ("x'abc", ["xabc"]), ('"abc', ["abc"]), ('x"$NODES', ["x2"]),  # never closed: to the end
    ("\\", [""]),
])
def test_what_lint_cannot_know_stays_as_written(word: str, fields: list[str]) -> None:
    assert expand(word, _lookup, arrays=ARRAYS) == fields


def test_arrays_are_expanded_only_where_the_shell_has_them() -> None:
    assert expand('"${A[@]}"', _lookup) == ["${A[@]}"]
    assert expand('"${A[@]}"', _lookup, arrays={"A": None}) == ["${A[@]}"]


def test_an_assignment_or_a_default_is_one_value_of_its_fields_joined() -> None:
    assert expand_joined('"${A[@]}"', _lookup, ARRAYS) == "a b c"
    assert expand_joined("$SPACED$EMPTY", _lookup, ARRAYS) == "x  y"
    assert expand_joined("", _lookup) == ""


def _nested_default(depth: int) -> str:
    return "${U:-" * depth + "x" + "}" * depth


def test_defaults_are_followed_down_to_the_nesting_limit() -> None:
    assert expand(_nested_default(MAX_NESTING), _lookup) == ["x"]
    assert expand(_nested_default(MAX_NESTING + 1), _lookup) == [_nested_default(MAX_NESTING + 1)]


def _long(length: int) -> dict[str, str]:
    return {"L": "y" * length}


def test_a_value_of_the_longest_length_is_expanded_one_longer_is_not() -> None:
    assert expand("$L", lambda name, _: _long(MAX_VALUE).get(name)) == ["y" * MAX_VALUE]
    assert expand("$L", lambda name, _: _long(MAX_VALUE + 1).get(name)) == ["$L"]


def test_array_elements_count_their_length_and_a_blank_each_against_the_limit() -> None:
    fits, over = {"A": ["y" * (MAX_VALUE - 1)]}, {"A": ["y" * MAX_VALUE]}
    assert expand('"${A[@]}"', _lookup, arrays=fits) == ["y" * (MAX_VALUE - 1)]
    assert expand('"${A[@]}"', _lookup, arrays=over) == ['"${A[@]}"']
    halves = {"A": ["y" * (MAX_VALUE // 2 - 1)] * 2}  # two elements and their two blanks: the limit exactly
    assert expand('"${A[@]}"', _lookup, arrays=halves) == halves["A"]
    assert expand('"${A[@]}"$NODES', _lookup, arrays=halves) == ['"${A[@]}"$NODES']
