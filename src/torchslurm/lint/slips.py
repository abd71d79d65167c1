"""lint rules of shell slips that bash and sbatch accept silently and the job then pays for.

`VAR= value` (bash runs `value` as a command), `# SBATCH` or an indented `#SBATCH` (sbatch skips
it: a comment), and `#SBATCH -nodes=3` (getopt reads one dash as the short option `-n` with the
value `odes=3`). Pure, nothing executed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from torchslurm.jobs.findings import Severity
from torchslurm.jobs.sbatch import sbatch_split
from torchslurm.lint.options import SBATCH, SHORT, parse_options
from torchslurm.lint.parse import DECLARE, Script
from torchslurm.lint.rule import Facts, Flag, rule
from torchslurm.lint.shell import ASSIGN_RE, MAX_NESTING

__all__: list[str] = []

# options whose loss changes what the job gets; another ignored directive is most likely switched off on purpose
_LAYOUT = {"nodes", "ntasks", "ntasks-per-node", "gpus", "gpus-per-node", "gpus-per-task", "gres", "cpus-per-task",
           "time", "partition", "mem", "exclusive", "account", "qos"}
_DIRECTIVE_LIKE_RE = re.compile(r"^(?:\s+#\s*|#\s+)SBATCH\s")


def _looks_like_a_value(word: str) -> bool:
    """After `VAR= `: a number, an upper-case word, a quoted string, an expansion; not a command name."""
    return bool(re.match(r"""([0-9]|["'$]|[A-Z][A-Z0-9_]*\Z|.*[,:=])""", word))


def _assign_spaces(s: Script) -> Iterator[tuple[int, str, str, str | None]]:
    """`VAR= value`: (line, VAR, value, the builtin it follows or None). bash sets VAR to "" and runs `value` as
    a command; after `export`, `local`, ... `value` is taken as another variable's name instead."""
    for command in s.commands:
        words, exporting, builtin = command.words, False, None
        if words and words[0] in DECLARE:
            options = "".join(w[1:] for w in words[1:] if w.startswith("-"))  # `declare -r -x`, `typeset -rx`
            exporting = words[0] == "export" or (words[0] in ("declare", "typeset") and "x" in options)
            builtin, words = words[0], [w for w in words[1:] if not w.startswith("-")]
        while words and ASSIGN_RE.match(words[0]):
            name, value = words[0].split("=", 1)
            if not value and len(words) > 1 and (exporting or _looks_like_a_value(words[1])):
                yield command.line, name.rstrip("+"), words[1], builtin
            words = words[1:]


@rule("assign-space", ("error",), "`NCCL_DEBUG= INFO`: bash runs `INFO` as a command. Fix: `NCCL_DEBUG=INFO`.")
def assign_space(x: Facts) -> Iterator[Flag]:
    for line, name, value, builtin in _assign_spaces(x.script):
        what = (f"`{builtin}` sets {name} to the empty string and takes `{value}` as the name of another variable "
                "(unless it is a valid name: \"not a valid identifier\"" if builtin else
                f"bash sets {name} to the empty string and runs `{value}` as a command (command not found")
        yield Flag("error", f"`{name}= {value}` has a space after `=`: {what}; with `set -e` the script stops "
                   "there).", f"{name}={value} (no spaces around `=`).", line)


def _header(s: Script) -> Iterator[tuple[int, str]]:
    """The script's lines above its first command: where sbatch reads directives."""
    return ((line, text) for line, text in s.bodies[0] if s.first_command is None or line < s.first_command)


@rule("ignored-directive", ("error", "info"),
      "`# SBATCH --nodes=2` or an indented `#SBATCH`: sbatch skips it. Error when no working directive sets that "
      "layout option; info otherwise. `##SBATCH` (switched off on purpose) is not reported.")
def ignored_directive(x: Facts) -> Iterator[Flag]:
    working = {key for _, key, _ in x.script.directive_list}
    for line, text in _header(x.script):
        if not _DIRECTIVE_LIKE_RE.match(text):
            continue
        options = parse_options(sbatch_split(text.split("SBATCH", 1)[1]), SBATCH, False)[0]
        lost = [key for key, _ in options if key not in working]
        important = [key for key in lost if key in _LAYOUT]
        if not lost:
            continue
        stripped = text.strip()
        shown = stripped if len(stripped) <= 60 else stripped[:60] + "..."
        fixed = "#SBATCH" + stripped.split("SBATCH", 1)[1]
        severity: Severity = "error" if important else "info"
        yield Flag(severity, f"`{shown}` is not a directive: sbatch reads only lines that start with exactly "
                   f"`#SBATCH`, so {', '.join('--' + k for k in lost)} is not set"
                   + (" and the job runs with the default." if important else "."),
                   f"write it at the start of the line: {fixed} (or ##SBATCH to switch it off on purpose).", line)


def _one_dash(word: str) -> bool:
    """`-nodes=3`, `-ntasks-per-node 4`: one dash before a long option's name."""
    name = word[1:].partition("=")[0]
    return (word.startswith("-") and len(name) > 2  # `--nodes`: no long name starts with `-`
            and any(long.startswith(name) for long in SBATCH.long_names))


@rule("one-dash-option", ("error",),
      "`#SBATCH -nodes=3` is read as `-n odes=3`. Fix: `--nodes=3`. (Said instead of the `invalid-value` of `-n`.)",
      supersedes=("invalid-value",))
def one_dash_option(x: Facts) -> Iterator[Flag]:
    for line, text in _header(x.script):
        if not text.startswith("#SBATCH"):
            continue
        for word in sbatch_split(text[len("#SBATCH"):]):
            if not _one_dash(word):
                continue
            letter, rest = word[1], word[2:]
            yield Flag("error", f"#SBATCH {word} has one dash: sbatch reads it as the short option -{letter} with "
                       f"the value `{rest}` (`-{letter} {rest}`), not as --{word[1:].partition('=')[0]}.",
                       f"two dashes: #SBATCH -{word}.", line, about=SHORT.get(letter, letter))


@rule("unread-lines", ("error", "warning"),
      "lines not read as commands: a heredoc whose end line never comes (error: bash reads the rest of the script "
      "as its text), a quote or expansion lint cannot see close (warning: \"line N could not be read\", the rest "
      "is not checked), or code nested in `eval`/`bash -c` deeper than lint reads (warning).")
def unread_lines(x: Facts) -> Iterator[Flag]:
    """Whatever lint does not read is said, never passed over in silence."""
    last = x.script.text.count("\n") + (not x.script.text.endswith("\n"))
    for u in x.script.unclosed:
        if u.heredoc:
            end = u.opener.removeprefix("<<").removeprefix("-")
            yield Flag("error", f"line {u.line}: the heredoc {u.opener} never ends: no line holds exactly `{end}`, "
                       "so bash reads every line after it as the heredoc's text (\"here-document delimited by "
                       "end-of-file\") and none of them runs.",
                       f"end it with a line that is exactly `{end}`, with nothing before or after it (`<<-` allows "
                       "leading tabs).")
        elif u.nested:
            yield Flag("warning", f"line {u.line} runs code inside code (`eval`, `bash -c`) more than {MAX_NESTING} "
                       "levels deep; lint reads no deeper, so the innermost code was not checked.",
                       "write the command out instead of wrapping it again and again.")
        else:
            rest = f"lines {u.line}-{last} were" if last > u.line else f"line {u.line} was"
            yield Flag("warning", f"line {u.line} could not be read: the `{u.opener}` that opens there never closes "
                       f"as lint reads it, so {rest} not checked.",
                       "check the line with `bash -n SCRIPT`; if bash reads it, write the value more plainly (set it "
                       "in a variable first) so that lint can check the rest.")
