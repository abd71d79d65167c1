"""lint.parse(text) -> Script: what a hand-written sbatch script asks for and runs. Pure, nothing executed.

The parsing code; the option tables it reads with are data in lint_options.py. Reads the `#SBATCH`
directives with sbatch's own tokenizer and option table, and the commands with bash's quoting
(single and double quotes, backslash escapes, `#` comments, line continuations), so a `;`, `&&` or
continuation inside `srun bash -c "..."` stays part of the quoted string, and the commands inside it
run under that srun, with its options; heredoc bodies are data, and `$'...'` is a quote with
backslash escapes. Options follow GNU getopt as sbatch and srun use it: an option that takes a value
takes the next word whatever it looks like (`--nodes -1`), one that takes none never does, and a
long option may be shortened to any unambiguous prefix (`--requeu`). torchrun's options end at the
training script.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from torchslurm.jobs.sbatch import sbatch_split
from torchslurm.lint.options import LAUNCHER_FLAGS, SBATCH, SHORT, SRUN, Options

_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")
_LAUNCH_MODULES = {"torch.distributed.run": "torchrun", "torch.distributed.launch": "torch.distributed.launch"}
_RANK_VARS_RE = re.compile(r"\$\{?(RANK|SLURM_PROCID|SLURM_NODEID|SLURM_LOCALID|LOCAL_RANK|NODE_RANK)\b")
# shell words that may come before a command on one line (`if ...; then srun ...`)
_PREFIX_WORDS = {"then", "do", "else", "if", "elif", "while", "until", "!", "{", "(", "time", "exec"}

_WORD_BREAK = " \t\n;&|()<>"


def parse_options(args: list[str], table: Options, stop_at_operand: bool) -> tuple[list[tuple[str, str]], list[str]]:
    """(option, value) pairs, long names where lint knows them, and the words left after the options.

    `stop_at_operand`: srun ends its options at the command; `#SBATCH` lines have no operands.
    A value-less option gets "" (so `-K` and `--kill-on-bad-exit` read as given).
    """
    found: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or arg == "-" or not arg.startswith("-"):  # getopt stops at `--`
            if stop_at_operand or arg == "--":
                return found, args[i + (arg == "--"):] if stop_at_operand else []
        elif arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            key = _full_name(key, table)
            if not eq and key not in table.long_flags and i + 1 < len(args):
                value, i = args[i + 1], i + 1
            found.append((key, value))
        else:
            i = _short_options(args, i, table, found)
        i += 1
    return found, []


def long_matches(key: str, table: Options) -> list[str]:
    """The long options `--key` names as getopt_long reads it: itself, or those it is a prefix of."""
    if key in table.long_names:
        return [key]
    return sorted(name for name in table.long_names if name.startswith(key))


def _full_name(key: str, table: Options) -> str:
    """`requeu` -> `requeue` (an unambiguous prefix); an unknown or ambiguous name as given."""
    matches = long_matches(key, table) if key else []
    return matches[0] if len(matches) == 1 else key


def _short_options(args: list[str], i: int, table: Options, found: list[tuple[str, str]]) -> int:
    """`-lK1`, `-N2`, `-N 2`: flags may be grouped; a value is the rest of the word or the next word."""
    word = args[i]
    for j, letter in enumerate(word[1:], start=1):
        key = SHORT.get(letter, letter)
        if letter in table.short_flags:
            found.append((key, ""))
            continue
        value = word[j + 1:]
        if letter not in table.short_optional and not value and i + 1 < len(args):
            value, i = args[i + 1], i + 1
        found.append((key, value))
        return i
    return i


def _syntax(text: str) -> Iterator[tuple[int, str]]:
    """Index and character of what bash reads as syntax: outside quotes (also `$'...'`), escapes,
    comments and heredoc bodies.

    An unquoted backslash-newline (a line continuation) comes out as one item, both characters.
    A heredoc body comes out as one item, `<<body`, at the newline that ends its delimiter line.
    """
    i, quote, word_start = 0, "", True
    heredocs: list[tuple[str, bool]] = []  # (delimiter, strip leading tabs): bodies after this line
    while i < len(text):
        ch = text[i]
        if quote == "'":
            quote = "" if ch == "'" else quote
        elif quote in ('"', "$'"):
            if ch == "\\":
                i += 1  # \" \\ \$ \' and backslash-newline: the next character is not syntax
            elif ch == quote[-1]:
                quote = ""
        elif ch == "\\":
            if text[i + 1:i + 2] == "\n":
                yield i, "\\\n"
            i += 1
        elif ch in "'\"":
            quote = ch
        elif ch == "$" and text[i + 1:i + 2] == "'":
            quote, i = "$'", i + 1
        elif ch == "#" and word_start:  # a comment: up to the newline, which is syntax again
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        elif ch == "\n" and heredocs:
            yield i, ch
            for delimiter, strip_tabs in heredocs:
                i = _heredoc_end(text, i + 1, delimiter, strip_tabs)
                yield i, "<<body"
            heredocs = []
        else:
            if _heredoc_starts(text, i):
                heredocs.append(_heredoc_delimiter(text, i + 2))
            yield i, ch
        word_start = not quote and ch in _WORD_BREAK
        i += 1


def _heredoc_starts(text: str, i: int) -> bool:
    """`<<` at i is a heredoc: not `<<<` (a here-string), not a shift in `(( ))` or `$(( ))`."""
    if not text.startswith("<<", i) or text.startswith("<<<", i) or text[i - 1:i] == "<":
        return False
    line = text[text.rfind("\n", 0, i) + 1:i]
    return line.count("((") <= line.count("))")


def _heredoc_delimiter(text: str, i: int) -> tuple[str, bool]:
    """After `<<`: the delimiter word with its quotes removed, and whether `<<-` strips tabs."""
    strip_tabs = text[i:i + 1] == "-"
    rest = text[i + strip_tabs:].lstrip(" \t")
    word = re.match(r"""(?:[^\s;&|()<>'"\\]|\\.|'[^']*'|"[^"]*")*""", rest)
    return re.sub(r"""\\(.)|['"]""", r"\1", word.group(0) if word else ""), strip_tabs


def _heredoc_end(text: str, start: int, delimiter: str, strip_tabs: bool) -> int:
    """Index of the newline that ends a heredoc body starting at `start` (its delimiter line)."""
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        line = text[start:end]
        if (line.lstrip("\t") if strip_tabs else line) == delimiter:
            return end
        start = end + 1
    return len(text)  # bash: "here-document delimited by end-of-file"


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Commands as bash reads them, numbered by their first physical line.

    A line continuation outside quotes is removed (bash's own rule); a quoted string spanning
    lines (`srun bash -c '...'`) stays one logical line, its text kept as written.
    """
    out: list[tuple[int, str]] = []
    start, line, pieces = 0, 1, []
    for i, item in _syntax(text):
        if item == "\\\n":
            pieces.append(text[start:i])
            start = i + 2
        elif item == "\n":
            out.append((line, "".join(pieces) + text[start:i]))
            line = text.count("\n", 0, i + 1) + 1
            start, pieces = i + 1, []
        elif item == "<<body":  # data, not commands
            line = text.count("\n", 0, i + 1) + 1
            start = i + 1
    rest = "".join(pieces) + text[start:]
    if rest:
        out.append((line, rest))
    return out


def commands(line: str) -> list[str]:
    """The simple commands of one logical line: split at unquoted `;`, `&&`, `||`, `|` and `&`.

    `&` and `|` that belong to a redirection (`2>&1`, `&>`, `>|`) do not split.
    """
    parts: list[str] = []
    start = 0
    for i, ch in _syntax(line):
        redirect = (i > 0 and line[i - 1] in "<>") or (ch == "&" and line[i + 1:i + 2] == ">")
        if ch in ";\n" or (ch in "&|" and not redirect):
            parts.append(line[start:i])
            start = i + 1
    parts.append(line[start:])
    return [p.strip() for p in parts if p.strip()]


@dataclass
class Launch:
    """One line that starts training: under srun or not, through a launcher or plain python."""

    line: int
    under_srun: bool
    srun_opts: dict[str, str]
    launcher: str | None  # "torchrun", "torch.distributed.launch" or None (plain python)
    nproc_per_node: int | None
    python: str
    rdzv_endpoint: str | None = None
    signals_to_handle: str | None = None
    ignored: list[str] = field(default_factory=list)
    """Signals the launcher ignores (`trap "" SIG` before `exec`)."""
    launcher_opts: dict[str, str] = field(default_factory=dict)
    """The launcher's options before the training script, `-` spelling (`nnodes`, `master-addr`); flags as ""."""
    per_task: bool = False
    """Each task's shell expands the `$VARS` of this line (`srun bash -c '...'`), not the batch shell once."""


@dataclass
class Script:
    """What lint needs to know about a script."""

    directives: dict[str, str] = field(default_factory=dict)
    """The `#SBATCH` options sbatch reads, by long name: the last value given."""
    directive_list: list[tuple[int, str, str]] = field(default_factory=list)
    """Every (line, option, value) of those, in order: sbatch checks each one."""
    late_directives: list[int] = field(default_factory=list)
    """Lines of `#SBATCH` after the first command, which sbatch ignores."""
    exports: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Variables set in the batch shell: (line, value)."""
    task_exports: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Variables set inside each task (`srun bash -c '...'`)."""
    launches: list[Launch] = field(default_factory=list)
    rank_cases: list[int] = field(default_factory=list)
    traps: list[str] = field(default_factory=list)
    first_line: str = ""
    """The script's first line as written (sbatch wants `#!` there)."""


def _launcher_args(args: list[str]) -> dict[str, str]:
    """The launcher's own options, `-` spelling (`--opt=v`, `--opt v`, `-r 3`, flags as ""), up to the
    training script: argparse ends them at the first operand, the rest are the script's arguments."""
    into: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        if args[i] == "--":
            break
        key, eq, value = _dashes(args[i]).lstrip("-").partition("=")
        if len(key) > 1 and not args[i].startswith("--"):  # `-r3`: a short option with its value attached
            key, value, eq = key[0], key[1:], "="
        if not eq and key not in LAUNCHER_FLAGS and i + 1 < len(args):
            value, i = args[i + 1], i + 1
        into[key] = value
        i += 1
    return into


def parse(text: str) -> Script:
    script = Script(first_line=text.split("\n", 1)[0])
    _parse_body(text, script, first_line=1, srun=None, header=True)
    return script


def _parse_body(text: str, script: Script, first_line: int, srun: dict[str, str] | None, header: bool,
                per_task: bool = False) -> None:
    """`srun`: the options of the srun that runs this text (`srun bash -c '...'`), None in the batch shell.
    `per_task`: each task's shell expands this text's `$VARS` (it came single-quoted)."""
    in_case, top = False, header
    for number, line in logical_lines(text):
        number += first_line - 1
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            if header:  # sbatch stops reading directives at the first command
                for key, value in parse_options(sbatch_split(stripped[len("#SBATCH"):]), SBATCH, False)[0]:
                    script.directives[key] = value
                    script.directive_list.append((number, key, value))
            elif top:
                script.late_directives.append(number)
            continue
        if not stripped or stripped.startswith("#"):
            continue
        header = False
        if stripped.startswith("case ") and _RANK_VARS_RE.search(stripped):
            in_case = True
        if in_case and "SOCKET_IFNAME" in stripped:
            script.rank_cases.append(number)
            in_case = False
        if stripped.startswith("esac"):
            in_case = False
        _parse_command(number, stripped, script, srun, per_task)


def _tokens(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return line.split()


def _parse_command(number: int, line: str, script: Script, srun: dict[str, str] | None, per_task: bool) -> None:
    for part in commands(line):
        words = _tokens(part)
        while words and words[0] in _PREFIX_WORDS:  # `then srun ...`, `exec python ...`
            words = words[1:]
        if words and words[0] == "trap":
            script.traps.append(part)
        if words and words[0] == "export":
            words = words[1:]
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            key, _, value = words[0].partition("=")
            (script.exports if srun is None else script.task_exports)[key] = (number, value)
            words = words[1:]
        launch = _parse_launch(number, words, script, srun, (per_task, part))
        if launch is not None:
            script.launches.append(launch)


def _parse_launch(number: int, words: list[str], script: Script, srun: dict[str, str] | None,
                  shell: tuple[bool, str]) -> Launch | None:
    """`shell`: whether each task expands this command's `$VARS`, and the command as written."""
    per_task, raw = shell
    ignored: list[str] = []
    if words and PurePosixPath(words[0]).name == "srun":
        pairs, words = parse_options(words[1:], SRUN, True)
        srun = dict(pairs)  # a later option wins, as with getopt
    if len(words) >= 3 and PurePosixPath(words[0]).name in ("bash", "sh") and words[1] == "-c":
        code = words[2]
        if '"$@"' not in code:  # `srun bash -c '<script>'`: lint the inner script as run by each task
            # `bash -c '...'`: each task expands the variables; `bash -c "..."`: the batch shell did, once
            inner = per_task or re.search(r"(^|\s)-c\s+'", raw) is not None
            _parse_body(code, script, first_line=number, srun=srun, header=False, per_task=inner)
            return None
        # `bash -c 'trap "" SIG; exec "$@"' NAME cmd...`: the command is the rest, signals ignored
        ignored = re.findall(r'trap\s+(?:""|\'\')\s+([A-Z0-9 ]+)', code)
        words = words[4:]
    if not words:
        return None
    name = PurePosixPath(words[0]).name
    launcher: str | None = None
    rest = words[1:]
    if name == "torchrun":
        launcher = "torchrun"
    elif _PYTHON_RE.match(name):
        if len(rest) >= 2 and rest[0] == "-m" and rest[1] in _LAUNCH_MODULES:
            launcher, rest = _LAUNCH_MODULES[rest[1]], rest[2:]
        elif not rest or (rest[0].startswith("-") and rest[0] != "-u"):
            return None  # `python -c ...`, `python --version`: not training
    else:
        return None
    opts_map = _launcher_args(rest) if launcher else {}
    nproc = opts_map.get("nproc-per-node")
    return Launch(number, srun is not None, srun or {}, launcher, int(nproc) if nproc and nproc.isdigit() else None,
                  python=words[0], rdzv_endpoint=opts_map.get("rdzv-endpoint"),
                  signals_to_handle=opts_map.get("signals-to-handle"), ignored=" ".join(ignored).split(),
                  launcher_opts=opts_map, per_task=per_task)


def _dashes(word: str) -> str:
    """`--nproc_per_node=8` -> `--nproc-per-node=8` (launchers accept both spellings)."""
    if not word.startswith("--"):
        return word
    key, eq, value = word.partition("=")
    return key.replace("_", "-") + eq + value


