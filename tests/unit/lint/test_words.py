"""A command's words as bash splits them, quotes and pieces kept whole: where each quote, `$(...)`, `${...}`,
`$'...'`, backtick and array assignment ends, whatever it holds."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from torchslurm.lint.parse import parse
from torchslurm.lint.shell import raw_words


@pytest.mark.parametrize(("text", "words"), [
    ("echo a$ b", ["echo", "a$", "b"]),
    ('echo $"a b" c', ["echo", '$"a b"', "c"]),                          # a locale string is a double quote
    ("echo a\\b c", ["echo", "a\\b", "c"]), ("echo a\\ b c", ["echo", "a\\ b", "c"]),
    ("echo $'it\\'s a' c", ["echo", "$'it\\'s a'", "c"]),                # `$'...'` takes escapes, `'...'` none
    ("echo --sep=$'\\t x' y", ["echo", "--sep=$'\\t x'", "y"]),
    ("echo $'\\'quoted\\' a' z", ["echo", "$'\\'quoted\\' a'", "z"]),
    ("echo 'a\\' b", ["echo", "'a\\'", "b"]),
    ("echo ${X:-a b} c", ["echo", "${X:-a b}", "c"]),
    ('echo "a\\" b" c', ["echo", '"a\\" b"', "c"]), ('echo "a\\\\" b', ["echo", '"a\\\\"', "b"]),
    ('echo "$(date "+%F %T")" x', ["echo", '"$(date "+%F %T")"', "x"]),  # quotes inside a piece inside quotes
    ('echo "`date "+%F %T"`" x', ["echo", '"`date "+%F %T"`"', "x"]),
    ('echo "${NAME:-"my run"}" x', ["echo", '"${NAME:-"my run"}"', "x"]),
    ("x=$(printf $'a\\'b') y", ["x=$(printf $'a\\'b')", "y"]),
    ("x=$(echo \\) a) y", ["x=$(echo \\) a)", "y"]), ("echo $(echo \\)) x", ["echo", "$(echo \\))", "x"]),
    ('echo $(echo ")") x', ["echo", '$(echo ")")', "x"]),
    ("echo ${X:-$(echo })} y", ["echo", "${X:-$(echo })}", "y"]),
    ("echo ${X:-$(echo } a)} y", ["echo", "${X:-$(echo } a)}", "y"]),
    ("echo $(echo ${X:-) b}) y", ["echo", "$(echo ${X:-) b})", "y"]),
    ("echo `echo \\` a` b", ["echo", "`echo \\` a`", "b"]),
    ("--lr 1 # no newline after it", ["--lr", "1"]), ("a # c\nb", ["a", "b"]),
    ("a \\\n b\\\nc \\\nd", ["a", "b\\\nc", "d"]),                                   # a line continuation between words
])
def test_words_end_where_bash_ends_them(text: str, words: list[str]) -> None:
    assert raw_words(text) == words


@pytest.mark.parametrize("array", [
    'A=(--name=\\"run\\")', "A=(--tag=it\\'s)", "A=(--tag=run# --lr 1)", "A=(--tag=X#1)", "A=(--tag=X1)",
    "A=(--host $(hostname -s) --x)", "A=(${X:-a)b})", "A=($'it\\'s' x)", "A=(a b)", "A+=('a b' \"c)\")",
    "A=(# it's a comment\n --lr 1\n)", "A=(\n --lr 1  # it's the default\n)", "A=(\\( x)",
])
def test_an_array_assignment_is_one_word_up_to_its_closing_parenthesis(array: str) -> None:
    assert raw_words(f"{array} B=1") == [array, "B=1"]


def _elements(assignment: str) -> list[str]:
    (launch,) = parse(f"{assignment}\nsrun -K python t.py \"${{A[@]}}\"\n").launches
    return launch.words[4:]


@pytest.mark.parametrize(("assignment", "elements"), [
    ("A=(\n  --nnodes 2 \\\n  --nproc_per_node 4\n)", ["--nnodes", "2", "--nproc_per_node", "4"]),
    ("A=(--name=\\\"run\\\" it\\'s)", ['--name="run"', "it's"]),
    ("A=(# it's a comment\n --lr 1 # it's the default\n)", ["--lr", "1"]),
    ("A=(--tag=run# --tag=X#1 --host $(hostname -s))", ["--tag=run#", "--tag=X#1", "--host", "$(hostname -s)"]),
    ("A=($'it\\'s' ${X:-a)b})", ["it's", "a)b"]),
])
def test_array_elements_are_read_as_bash_reads_them(assignment: str, elements: list[str]) -> None:
    assert _elements(assignment) == elements
    if shutil.which("bash") is not None and "$(" not in assignment:
        done = subprocess.run(["bash", "-c", f'{assignment}\nprintf "%s\\0" "${{A[@]}}"'], capture_output=True,
                              text=True, timeout=30, check=True)
        assert done.stdout.split("\0")[:-1] == elements


@pytest.mark.parametrize(("text", "line", "opener"), [
    ("A=('a b)\nsrun python t.py\n", 1, "A=("),
    ("A=(a # c", 1, "A=("),
    ("echo a\nx=$(echo 'abc\nsrun python t.py\n", 2, "$("),
    ("echo a\nx=$(echo $'abc\nsrun python t.py\n", 2, "$("),
])
def test_a_quote_left_open_inside_an_array_or_a_piece_is_recorded(text: str, line: int, opener: str) -> None:
    script = parse(text)
    assert [(u.line, u.opener, u.heredoc) for u in script.unclosed] == [(line, opener, False)]
    assert script.launches == []
