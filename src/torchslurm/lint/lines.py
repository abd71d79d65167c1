"""Reading an sbatch script's text as bash does, before any word is looked at: where syntax is
(outside quotes, `$'...'`, escapes, comments, heredoc bodies), logical lines (continuations
joined, quoted strings spanning lines kept whole) and the simple commands of a line. Pure."""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from torchslurm.lint.shell import NAME_START, array_scan, scan

_WORD_BREAK = " \t\n;&|()<>"


OPEN = "<<open"
"""The item `_syntax` ends with when a quote or expansion never closes: at its opening index."""
NO_END = "<<noend"
"""The item `_syntax` gives, at its `<<`, for a heredoc whose delimiter line never comes."""


def _syntax(text: str) -> Iterator[tuple[int, str]]:
    """Index and character of what bash reads as syntax: outside quotes (also `$'...'`), escapes,
    comments, array assignments and heredoc bodies. Characters that can change nothing (letters, digits,
    most punctuation) are passed over in runs, not yielded: the readers look only at the others.

    An unquoted backslash-newline (a line continuation) comes out as one item, both characters.
    A heredoc body comes out as one item, `<<body`, at the newline that ends its delimiter line; one that
    runs to the end of the text first gives `NO_END` at its `<<`. A quote or expansion that never closes
    ends the items with `OPEN` at its opening index. Linear in the length of the text.
    """
    i, quote, quote_at, word_start = 0, "", 0, True
    heredocs: list[tuple[str, bool, int]] = []  # (delimiter, strip leading tabs, index): bodies after this line
    shift = _ShiftCheck(text)
    while i < len(text):
        ch = text[i]
        if text[i - 1:i] in ("\n", "") and not quote and not heredocs and (plain := _PLAIN_LINE.match(text, i)):
            i = plain.end() - 1  # a line of words and blanks alone (most of a long script): only its newline counts
            yield i, "\n"
            i += 1
            continue
        if quote:
            special = (_IN_SINGLE if quote == "'" else _IN_DOUBLE if quote == '"' else _IN_DOLLAR).search(text, i)
            if special is None:
                break
            i, ch = special.start(), special.group()
            if ch == "\\":
                i += 1  # \" \\ \$ \' and backslash-newline: the next character is not syntax
            elif ch == quote[-1]:
                quote = ""
            elif ch == "`" or text.startswith(("$(", "${"), i):  # "$(cmd "$x" | head)": the inner quotes are its own
                end, closed = scan(text, i)
                if not closed:
                    yield i, OPEN
                    return
                i = end - 1
        elif ch == "\\":
            if text[i + 1:i + 2] == "\n":
                yield i, "\\\n"
            i += 1
        elif ch in "'\"":
            quote, quote_at = ch, i
        elif ch == "`" or text.startswith(("$(", "${"), i):
            end, closed = scan(text, i)  # run at run time: one piece
            if not closed:
                yield i, OPEN
                return
            i = end - 1
        elif ch == "$" and text[i + 1:i + 2] == "'":
            quote, quote_at, i = "$'", i, i + 1
        elif ch == "#" and word_start:  # a comment: up to the newline, which is syntax again
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        elif ch == "\n" and heredocs:
            yield i, ch
            for delimiter, strip_tabs, at in heredocs:
                i, found = _heredoc_end(text, i + 1, delimiter, strip_tabs)
                if not found:
                    yield at, NO_END
                yield i, "<<body"
            heredocs = []
        elif ch not in _SYNTAX:  # words and blanks: only an array assignment (`A=(`) among them matters
            end = _PLAIN.match(text, i).end()  # type: ignore[union-attr]  # ch itself matches
            array = _array_at(text, i, end, word_start)
            if array is None:
                i, word_start = end, text[end - 1] in " \t"
                continue
            at, after, closed = array
            if not closed:
                yield at, OPEN
                return
            i, word_start = after, False
            continue
        else:
            if ch == "<" and text.startswith("<<", i) and not shift(i):
                heredocs.append((*_heredoc_delimiter(text, i + 2), i))
            yield i, ch
        word_start = not quote and ch in _WORD_BREAK
        i += 1
    if quote:
        yield quote_at, OPEN
    for _, _, at in heredocs:  # `cat <<EOF` on the last line, no newline after it
        yield at, NO_END


_PLAIN_LINE = re.compile(r"[^\\'\"`$#<>();&|\n]*\n")
_IN_SINGLE = re.compile(r"'")
_IN_DOUBLE = re.compile(r"[\\\"`]|\$[({]")
_IN_DOLLAR = re.compile(r"[\\']")
_SYNTAX = frozenset("\\'\"`$#\n;&|()<>")
_PLAIN = re.compile(r"[^\\'\"`$#\n;&|()<>]+|[$#]")


def _array_at(text: str, start: int, end: int, word_start: bool) -> tuple[int, int, bool] | None:
    """If the run of words and blanks text[start:end] ends in a word that starts an array assignment
    (`ARGS=(`, `ARGS+=(`): where it starts, the index after it and whether it closes (array_scan). Only
    such a run is looked at twice."""
    if text[end - 1:end + 1] != "=(":
        return None
    blank = max(text.rfind(" ", start, end), text.rfind("\t", start, end))
    at = blank + 1 if blank >= 0 else start
    if not (blank >= 0 or word_start) or text[at] not in NAME_START:
        return None
    found = array_scan(text, at)
    return None if found is None else (at, *found)


class _ShiftCheck:
    """Whether a `<<` is a shift, not a heredoc: `<<<` (a here-string), or inside `(( ))` or `$(( ))` (its line
    has more `((` than `))` before it). Each line's `((` and `))` are found once, so a line of many `<<` costs
    linear time."""

    def __init__(self, text: str) -> None:
        self.text, self.start, self.end = text, -1, -1
        self.opens: list[int] = []
        self.closes: list[int] = []

    def __call__(self, i: int) -> bool:
        text = self.text
        if text.startswith("<<<", i) or text[i - 1:i] == "<":
            return True
        if not self.start <= i < self.end:  # a new line: the same matches str.count finds, left to right
            self.start = text.rfind("\n", 0, i) + 1
            end = text.find("\n", i)
            self.end = len(text) if end < 0 else end
            line = text[self.start:self.end]
            self.opens = [m.start() + self.start for m in _OPENS.finditer(line)] if "((" in line else []
            self.closes = [m.start() + self.start for m in _CLOSES.finditer(line)] if self.opens else []
        return bisect.bisect_right(self.opens, i - 2) > bisect.bisect_right(self.closes, i - 2)


_OPENS, _CLOSES = re.compile(r"\(\("), re.compile(r"\)\)")
_UNQUOTE = re.compile(r"""\\(.)|['"]""")
_DELIMITER = re.compile(r"""[ \t]*((?:[^\s;&|()<>'"\\]|\\.|'[^']*'|"[^"]*")*)""")


def _heredoc_delimiter(text: str, i: int) -> tuple[str, bool]:
    """After `<<`: the delimiter word with its quotes removed, and whether `<<-` strips tabs."""
    strip_tabs = text[i:i + 1] == "-"
    word = _DELIMITER.match(text, i + strip_tabs)
    return _UNQUOTE.sub(r"\1", word.group(1) if word else ""), strip_tabs


def _heredoc_end(text: str, start: int, delimiter: str, strip_tabs: bool) -> tuple[int, bool]:
    """Index of the newline that ends a heredoc body starting at `start` (its delimiter line), and whether
    the delimiter line was found (else the body runs to the end of the text)."""
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        line = text[start:end]
        if (line.lstrip("\t") if strip_tabs else line) == delimiter:
            return end, True
        start = end + 1
    return len(text), False  # bash: "here-document delimited by end-of-file"


@dataclass(frozen=True)
class Unclosed:
    """Something that runs to the end of the text: bash reads no command after it."""

    line: int
    """The physical line where it opens."""
    opener: str
    """As written: `'`, `"`, `$(`, `${`, a backtick, `NAME=(`, or a heredoc's `<<EOF`."""
    heredoc: bool
    """A heredoc with no delimiter line: bash reads the rest as its text (else lint cannot tell where the
    quote or expansion ends, and bash likely cannot either)."""
    nested: bool = False
    """Code inside code (`eval`, `bash -c`) deeper than lint reads (shell.MAX_NESTING): not a quote left open,
    but it is not read either."""


@dataclass(frozen=True)
class Lines:
    """A text read as bash reads it, before any word is looked at."""

    logical: list[tuple[int, str]]
    """Commands as bash reads them (logical lines), numbered by their first physical line."""
    spans: list[tuple[int, int]]
    """The physical lines (first, last) each logical line covers, its heredoc bodies included."""
    unclosed: Unclosed | None
    """A quote or expansion that never closes (what follows it is not read), or a heredoc with no end."""


def read_lines(text: str) -> Lines:
    """`text` as logical lines: a line continuation outside quotes is removed (bash's own rule); a quoted
    string spanning lines (`srun bash -c '...'`) stays one logical line, its text kept as written.

    A quote or expansion that never closes ends the reading at the physical line where it opens: the
    logical line is cut there, and `unclosed` says where.
    """
    out: list[tuple[int, str]] = []
    spans: list[tuple[int, int]] = []
    start, line, pieces, unclosed = 0, 1, [], None
    line_at = _line_of(text)
    for i, item in _syntax(text):
        if item == "\\\n":
            pieces.append(text[start:i])
            start = i + 2
        elif item == "\n":
            out.append((line, "".join(pieces) + text[start:i]))
            spans.append((line, line_at(i)))
            line = line_at(i) + 1
            start, pieces = i + 1, []
        elif item == "<<body":  # data, not commands
            spans[-1] = (spans[-1][0], line_at(i))
            line = line_at(i) + 1
            start = i + 1
        elif item in (OPEN, NO_END):
            opener = text[i:i + 2] if text[i] == "$" else text[i]
            if item == NO_END:
                opener = "<<" + _heredoc_delimiter(text, i + 2)[0]
            elif array_scan(text, i):
                opener = text[i:text.index("(", i) + 1]
            unclosed = Unclosed(line_at(i), opener, item == NO_END)
            if item == OPEN:  # nothing after the opener can be read
                out.append((line, "".join(pieces) + text[start:i]))
                spans.append((line, line_at(i)))
                return Lines(out, spans, unclosed)
    rest = "".join(pieces) + text[start:]
    if rest:
        out.append((line, rest))
        spans.append((line, line_at(len(text) - 1)))
    return Lines(out, spans, unclosed)


def _line_of(text: str) -> Callable[[int], int]:
    """The physical line (from 1) of an index of `text` (its end: the last line)."""
    newlines = [i for i, ch in enumerate(text) if ch == "\n"]
    last = len(newlines) + (not text.endswith("\n"))
    return lambda i: min(bisect.bisect_left(newlines, i) + 1, max(last, 1))


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Commands as bash reads them, numbered by their first physical line (read_lines)."""
    return read_lines(text).logical


def commands(line: str) -> list[str]:
    """The simple commands of one logical line: split at unquoted `;`, `&&`, `||`, `|`, `&`, and the
    parentheses of subshells and `case` patterns (`( cd x && srun ... )`, `0) srun ... ;;`).

    `&` and `|` that belong to a redirection (`2>&1`, `&>`, `>|`) do not split.
    """
    return [part for part, _ in commands_ending(line)]


_COMMAND_SYNTAX = re.compile(r"[;&|()\n]")


def commands_ending(line: str) -> list[tuple[str, bool]]:
    """commands(line), each with whether it ends in a lone `&` (runs in the background)."""
    if _COMMAND_SYNTAX.search(line) is None:  # no separator, quoted or not: one command (a fast path)
        return [(line.strip(), False)] if line.strip() else []
    parts: list[tuple[str, bool]] = []
    start = 0
    for i, ch in _syntax(line):
        if len(ch) > 1:  # a continuation, a heredoc body, an unclosed quote: none splits commands
            continue
        redirect = (i > 0 and line[i - 1] in "<>") or (ch == "&" and line[i + 1:i + 2] == ">")
        if ch in ";\n()" or (ch in "&|" and not redirect):
            background = ch == "&" and line[i + 1:i + 2] != "&" and line[i - 1:i] != "&"
            parts.append((line[start:i], background))
            start = i + 1
    parts.append((line[start:], False))
    return [(p.strip(), bg) for p, bg in parts if p.strip()]
