"""Reading an sbatch script's text as bash does, before any word is looked at: where syntax is
(outside quotes, `$'...'`, escapes, comments, heredoc bodies), logical lines (continuations
joined, quoted strings spanning lines kept whole) and the simple commands of a line. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterator

from torchslurm.lint.shell import opaque_end

_WORD_BREAK = " \t\n;&|()<>"


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
            elif quote == '"' and (ch == "`" or text.startswith(("$(", "${"), i)):
                i = (opaque_end(text, i) or i + 1) - 1  # "$(cmd "$x" | head)": the inner quotes are its own
        elif ch == "\\":
            if text[i + 1:i + 2] == "\n":
                yield i, "\\\n"
            i += 1
        elif ch in "'\"":
            quote = ch
        elif ch == "`" or text.startswith(("$(", "${"), i):  # run at run time: one piece of a word
            i = (opaque_end(text, i) or i + 1) - 1
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
    """The simple commands of one logical line: split at unquoted `;`, `&&`, `||`, `|`, `&`, and the
    parentheses of subshells and `case` patterns (`( cd x && srun ... )`, `0) srun ... ;;`).

    `&` and `|` that belong to a redirection (`2>&1`, `&>`, `>|`) do not split.
    """
    return [part for part, _ in commands_ending(line)]


def commands_ending(line: str) -> list[tuple[str, bool]]:
    """commands(line), each with whether it ends in a lone `&` (runs in the background)."""
    parts: list[tuple[str, bool]] = []
    start = 0
    for i, ch in _syntax(line):
        redirect = (i > 0 and line[i - 1] in "<>") or (ch == "&" and line[i + 1:i + 2] == ">")
        if ch in ";\n()" or (ch in "&|" and not redirect):
            background = ch == "&" and line[i + 1:i + 2] != "&" and line[i - 1:i] != "&"
            parts.append((line[start:i], background))
            start = i + 1
    parts.append((line[start:], False))
    return [(p.strip(), bg) for p, bg in parts if p.strip()]
