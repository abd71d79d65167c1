"""lint_parse: commands read with bash's quoting, options with sbatch's and srun's getopt tables."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from torchslurm.lint.lines import commands, logical_lines
from torchslurm.lint.options import SBATCH, SRUN, parse_options
from torchslurm.lint.parse import parse
from torchslurm.lint.report import lint
from torchslurm.lint.shell import MAX_VALUE


def test_continuations_and_quoted_multiline_joined() -> None:
    lines = logical_lines("srun \\\n  python a.py\nbash -c '\necho 1\n'\nls\n")
    assert [n for n, _ in lines] == [1, 3, 6]
    assert lines[0][1] == "srun   python a.py"  # bash drops backslash-newline outside quotes


def test_continuation_inside_double_quotes_stays_in_the_string() -> None:
    text = 'srun -K bash -c "cd /x && python t.py \\\n --lr 0.1"\necho done\n'
    assert [n for n, _ in logical_lines(text)] == [1, 3]


def test_hash_inside_a_multiline_quote_is_not_a_comment() -> None:
    text = "srun bash -c '\n# set up\npython t.py\n'\nls\n"
    assert [n for n, _ in logical_lines(text)] == [1, 5]


def test_comment_with_an_apostrophe_does_not_open_a_quote() -> None:
    assert [n for n, _ in logical_lines("srun python t.py  # it's here\nls\n")] == [1, 2]


HEREDOC_SCRIPTS = [
    "echo L1\ncat >/dev/null <<EOF\necho no; srun x\nit's\nEOF\necho L6\n",
    "echo L1\ncat >/dev/null <<-'END' # a comment\n\techo no\n\tEND\necho L5\n",
    'cat >/dev/null <<"A" && cat >/dev/null <<B\necho no\nA\necho no\nB\necho L6\n',
    "cat >/dev/null <<EOF\necho no\n",  # no delimiter line: the body runs to the end (bash warns)
    "cat <<< 'echo here-string' >/dev/null\necho L2\necho L3 $(( 1 << 2 ))\necho L4\n",
    "echo L1 $'it\\'s' ; echo L1b\necho L2 \"$'\"\necho L3\n",
]


@pytest.mark.parametrize("text", HEREDOC_SCRIPTS)
def test_heredoc_bodies_and_ansi_c_quotes_are_read_as_bash_reads_them(text: str, tmp_path: Path) -> None:
    """The commands lint sees are those bash runs: each `echo Ln` names its own line."""
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    script = tmp_path / "s.sh"
    script.write_text(text)
    ran = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30, check=False)
    markers = [line.split()[0] for line in ran.stdout.splitlines() if line.startswith("L")]
    seen = [(number, part) for number, line in logical_lines(text) for part in commands(line)]
    assert [part.split()[1] for _, part in seen if part.startswith("echo L")] == markers
    assert all(part.split()[1].rstrip("b") == f"L{number}" for number, part in seen if part.startswith("echo L"))
    assert not [part for _, part in seen if part.startswith(("echo no", "srun"))]


def test_a_heredoc_body_is_not_linted_but_the_command_after_it_is() -> None:
    script = parse("#!/bin/bash\n#SBATCH -N 2\ncat > cfg <<EOF\nsrun python a.py\n#SBATCH -N 4\nEOF\n"
                   "srun -K python b.py\nsrun -N1 bash -c 'cat > c <<X\npython c.py\nX\npython d.py'\n")
    found = [(launch.line, launch.srun_opts) for launch in script.launches]
    assert found == [(7, {"kill-on-bad-exit": ""}), (11, {"nodes": "1"})]
    assert script.directives == {"nodes": "2"} and script.first_command == 3
    assert [text for _, text in script.bodies[0] if "SBATCH" in text] == ["#SBATCH -N 2"]  # the heredoc's is data


@pytest.mark.parametrize(("line", "parts"), [
    ('srun bash -c "cd /x && python t.py"', ['srun bash -c "cd /x && python t.py"']),
    ("cd /x && srun python t.py; echo 'a;b' || true", ["cd /x", "srun python t.py", "echo 'a;b'", "true"]),
    ("srun python t.py 2>&1 | tee log &> all", ["srun python t.py 2>&1", "tee log &> all"]),
    ("srun a & srun b & wait", ["srun a", "srun b", "wait"]),
    ("srun python t.py # a; b", ["srun python t.py # a; b"]),
])


def test_commands_split_outside_quotes_only(line: str, parts: list[str]) -> None:
    assert commands(line) == parts


@pytest.mark.parametrize(("words", "opts", "rest"), [
    ("--ntasks 4 python t.py", [("ntasks", "4")], ["python", "t.py"]),
    ("--label --kill-on-bad-exit python t.py", [("label", ""), ("kill-on-bad-exit", "")], ["python", "t.py"]),
    ("-lK1 -N2 -n 8 python", [("l", ""), ("kill-on-bad-exit", "1"), ("nodes", "2"), ("ntasks", "8")], ["python"]),
    ("-K python", [("kill-on-bad-exit", "")], ["python"]),
    ("--export ALL -- python -u", [("export", "ALL")], ["python", "-u"]),
])


def test_srun_options_end_at_the_command(words: str, opts: list[tuple[str, str]], rest: list[str]) -> None:
    assert parse_options(words.split(), SRUN, True) == (opts, rest)


def test_sbatch_option_that_takes_a_value_takes_the_next_word_whatever_it_is() -> None:
    assert parse_options(["-N", "4", "--nodes", "-1", "--requeue", "--time", "10"], SBATCH, False) == (
        [("nodes", "4"), ("nodes", "-1"), ("requeue", ""), ("time", "10")], [])


def test_commands_inside_srun_bash_c_run_under_that_srun() -> None:
    script = parse('#!/bin/bash\n#SBATCH -N 2\nsrun --kill-on-bad-exit=1 -l bash -c "export X=1; python t.py"\n')
    (launch,) = script.launches
    assert (launch.line, launch.under_srun, launch.srun_opts) == (3, True, {"kill-on-bad-exit": "1", "l": ""})
    assert script.task_exports == {"X": (3, "1")} and script.exports == {}


def test_every_directive_kept_with_its_line_and_late_ones_noted() -> None:
    script = parse("#!/bin/bash\n#SBATCH -N 4\n#SBATCH --nodes=-1\necho hi\n#SBATCH --nodes=8\n")
    assert script.directives == {"nodes": "-1"}
    assert script.directive_list == [(2, "nodes", "4"), (3, "nodes", "-1")]
    assert script.first_command == 4  # sbatch reads #SBATCH lines only above it: not line 5


def test_shell_keywords_before_a_command() -> None:
    script = parse("#!/bin/bash\nif true; then srun python t.py; fi\ntime python u.py\n")
    assert [(ln.line, ln.under_srun) for ln in script.launches] == [(2, True), (3, False)]


def test_sbatch_long_options_cover_what_sbatch_help_lists(tmp_path: Path) -> None:
    """Every option `sbatch --help` and `--usage` name is in the table (sbatch reads a config file first)."""
    if shutil.which("sbatch") is None:
        pytest.skip("sbatch is not installed")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=lint\nSlurmctldHost=localhost\n")
    env = {"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}
    text = "".join(subprocess.run([shutil.which("sbatch") or "sbatch", flag], capture_output=True, text=True,
                                  timeout=30, check=False, env=env).stdout for flag in ("--help", "--usage"))
    named = set(re.findall(r"--([a-z][a-z0-9-]*)", text))
    assert len(named) > 80 and named <= SBATCH.long_names
    assert set(re.findall(r"^\s+-([a-zA-Z]),", text, re.MULTILINE)) <= set(SBATCH.short_names)


def test_directives_after_first_command_are_ignored_like_sbatch() -> None:
    script = parse("#!/bin/bash\n#SBATCH --nodes=2\necho hi\n#SBATCH --nodes=8\n")
    assert script.directives == {"nodes": "2"}



@pytest.mark.parametrize("value", ["${4:-'{}'}", "\"${4:-'}'}\"", "${X:-{a}}", "${X:-\"a b\"}", "$(f (1))"])
def test_a_default_with_quotes_or_braces_ends_where_bash_ends_it(value: str) -> None:
    text = f"#!/bin/bash\n#SBATCH -N 2\noverrides={value}\npython train.py $overrides\n"
    script = parse(text)
    assert [ln.line for ln in script.launches] == [4] and script.unclosed == []
    assert script.read == [(1, 1), (2, 2), (3, 3), (4, 4)]


@pytest.mark.parametrize(("text", "line", "opener"), [
    ("echo a\nx='abc\nsrun python t.py\n", 2, "'"),
    ("echo a\ny=$(hostname\nsrun python t.py\n", 2, "$("),
    ("echo a\nz=${X:-{}\nsrun python t.py\n", 2, "${"),
    ("A=(\n --nnodes 2\nsrun python t.py\n", 1, "A=("),
])
def test_what_never_closes_is_recorded_and_nothing_after_it_is_read(text: str, line: int, opener: str) -> None:
    script = parse(text)
    assert [(u.line, u.opener, u.heredoc) for u in script.unclosed] == [(line, opener, False)]
    assert script.launches == [] and max(last for _, last in script.read) == line


def test_a_heredoc_with_no_end_line_is_read_as_bash_reads_it_and_recorded() -> None:
    script = parse("cat <<EOF >c.yaml\nlr: 1\nEOF \nsrun python t.py\n")
    assert script.launches == [] and script.read == [(1, 4)]
    assert [(u.line, u.opener, u.heredoc) for u in script.unclosed] == [(1, "<<EOF", True)]


def test_unread_lines_are_reported_never_passed_in_silence() -> None:
    (f,) = [f for f in lint("#!/bin/bash\n#SBATCH -N 2\nx=$(hostname\nsrun python t.py\n") if f.code == "unread-lines"]
    assert f.severity == "warning" and f.message.startswith("line 3 could not be read: the `$(` that opens there")
    assert "lines 3-4 were not checked" in f.message and "bash -n" in f.hint


def test_arrays_are_followed_into_the_launch_line() -> None:
    text = ("#!/bin/bash\n#SBATCH -N 2\nARGS=(\n  --nnodes 2  # both nodes\n  --nproc_per_node 4\n)\n"
            "ARGS+=(--rdzv-backend=c10d)\nsrun torchrun \"${ARGS[@]}\" train.py\n")
    (launch,) = parse(text).launches
    assert launch.line == 8 and launch.nproc_per_node == 4
    assert launch.launcher_opts == {"nnodes": "2", "nproc-per-node": "4", "rdzv-backend": "c10d"}


def test_an_array_element_keeps_its_blanks_when_quoted() -> None:
    (launch,) = parse("A=(--x 'a b')\nsrun python t.py \"${A[@]}\" ${A[@]} \"${A[*]}\"\n").launches
    assert launch.words[-8:] == ["python", "t.py", "--x", "a b", "--x", "a", "b", "--x a b"]


class _Counted(str):
    """A script that counts the characters lint copies out of it or searches in it (slices, find, rfind, count):
    reading it in linear time examines each character a bounded number of times, whatever the script holds."""

    examined = 0

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        part = super().__getitem__(key)
        _Counted.examined += len(part) if isinstance(key, slice) else 0
        return part

    def find(self, sub, start=None, end=None):  # type: ignore[no-untyped-def,override]
        at = super().find(sub, start, end)
        _Counted.examined += (at if at >= 0 else len(self) if end is None else end) - (start or 0)
        return at

    def rfind(self, sub, start=None, end=None):  # type: ignore[no-untyped-def,override]
        at = super().rfind(sub, start, end)
        _Counted.examined += (len(self) if end is None else end) - max(at, start or 0)
        return at

    def count(self, sub, start=None, end=None):  # type: ignore[no-untyped-def,override]
        _Counted.examined += (len(self) if end is None else end) - (start or 0)
        return super().count(sub, start, end)


def test_reading_a_long_script_takes_linear_time_in_lines_and_heredocs() -> None:
    """Each heredoc copied the rest of the script to read its delimiter: quadratic in heredocs (200,000 lines of
    them took minutes). Counted in characters examined, not seconds: a test of time would be a test of the machine."""
    block = ("cat <<EOF > f\nbody $x\nEOF\necho 'a b' \"$c\" x=$((1 + 2)) <<< w\n# note\nsrun -K python t.py\n"
             "cat <<-'END'\n\tbody\n\tEND\n")
    text = _Counted("#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1\n" + block * 400)
    _Counted.examined = 0
    lint(text)
    assert _Counted.examined < 20 * len(text), f"{_Counted.examined} characters examined for {len(text)}"


def test_a_variable_that_doubles_on_every_line_stays_bounded() -> None:
    script = parse("#!/bin/bash\nA=xxxxxxxxxxxxxxxx\n" + "A=$A$A\n" * 64 + "B=${A}y\nsrun -K python t.py $B\n")
    assert len(script.exports["A"][1]) <= MAX_VALUE and len(script.exports["B"][1]) <= MAX_VALUE
    assert len(script.launches[0].words[-1]) <= MAX_VALUE


@pytest.mark.parametrize("line", [
    'echo "' + '$(echo "' * 600 + "x" + '")' * 600 + '"',      # bash -n reads both
    "echo $((" + "(" * 600 + "1" + ")" * 600 + "))",
    "echo ${a:-" * 600 + "x" + "}" * 600,
])
def test_nesting_hundreds_deep_is_read_without_a_recursion_error(line: str) -> None:
    script = parse(f"#!/bin/bash\n{line}\nsrun -K python t.py\n")
    assert script.unclosed == [] and [ln.line for ln in script.launches] == [3]
