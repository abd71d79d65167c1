"""Words of one simple command as bash makes them: quotes removed, variables expanded where lint knows them.

Pure, part of `lint`. `raw_words` splits a command at unquoted blanks, keeping quotes, `$(...)`,
`$((...))` and backticks inside their word. `expand` then does what the shell that runs the
command does: single quotes are literal, double quotes expand `$VAR` but keep `\\$` as a literal
`$` (expanded later, by whichever shell runs the text next: `srun bash -c "$LAUNCHER"` hands it to
each task), an unquoted expansion is split into fields, and `$(...)` / backticks run at run time,
so they stay as written. A variable lint cannot know stays `$NAME`, except the per-task
variables (SLURM_PROCID, SLURM_NODEID, SLURM_LOCALID) expanded by the batch shell: they become a
marker (`batch_marker`), because there they are 0 for every task.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from torchslurm.lint.arithmetic import evaluate

PER_TASK_VARS = frozenset({"SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID"})
"""Set by srun in each task; the batch shell has them too, as 0 (it is task 0 of the batch step)."""

ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\+?=")
"""`NAME=` or `NAME+=` at the start of a word: an assignment."""

MAX_NESTING = 16
"""How deep lint follows code inside code (`${A:-${B:-...}}`, `bash -c` in `eval`); deeper stays as written."""

_MARK = "\x00"
_MARKER_RE = re.compile(f"{_MARK}([A-Z_]+){_MARK}")
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A variable's name."""
_SPECIAL = "@*#?$!-0123456789"

MAX_VALUE = 100_000
"""The longest value lint keeps for a variable (or elements for an array); a longer one (`A=$A$A` ten times
over) it no longer knows, instead of holding gigabytes."""

Lookup = Callable[[str, bool], "str | None"]
"""A variable's value as the current shell sees it, or None when lint cannot know it; the flag says the
name is read in `$(( ))`, where Slurm's counts that the `#SBATCH` lines fix (SLURM_NNODES) are known."""


def batch_marker(name: str) -> str:
    """What `$name` becomes when the batch shell expands a per-task variable."""
    return f"{_MARK}{name}{_MARK}"


def batch_expanded(text: str) -> str | None:
    """The per-task variable the batch shell expanded into `text`, if any."""
    m = _MARKER_RE.search(text)
    return m.group(1) if m else None


def shown(text: str) -> str:
    """`text` as the script wrote it: markers back to `$NAME`."""
    return _MARKER_RE.sub(r"$\1", text)


def _skip_quoted(text: str, i: int) -> int:
    """Index after the quoted or substituted piece that starts at i (`'..'`, `".."`, `$(..)`, `${..}`, `` `..` ``)."""
    return scan(text, i)[0]


def scan(text: str, i: int) -> tuple[int, bool]:
    """The piece that starts at i (a quote, `$(`, `${`, `$'`, a backtick): the index after it, and whether it
    closes before the text ends (else the index is len(text)).

    Read as bash matches them: inside `"..."` a `$(`, `${` or backtick is a piece of its own (`"$(cmd "$x")"`);
    inside `${ ... }` and `$( ... )` quotes, escapes and nested pieces are skipped, and `{`/`(` nest (`${x:-'{}'}`,
    `${x:-{a}}`, `$(f (1))`). Iterative, the open pieces on a stack: any depth of nesting costs no recursion."""
    kinds: list[str] = []  # the open pieces: ' " ` $' ( {
    depths: list[int] = []  # for ( and {: how many of them are open inside it (its own counts as 1)
    j = _open(text, i, kinds, depths)
    while kinds:
        if j >= len(text):
            return len(text), False
        kind, c = kinds[-1], text[j]
        if kind == "'":
            end = text.find("'", j)
            if end == -1:
                return len(text), False
            kinds.pop(), depths.pop()
            j = end + 1
        elif kind in ('"', "`", "$'"):
            if c == "\\":
                j += 2
            elif c == kind[-1]:
                kinds.pop(), depths.pop()
                j += 1
            elif kind == '"' and (c == "`" or text.startswith(("$(", "${"), j)):
                j = _open(text, j, kinds, depths)
            else:
                j += 1
        elif c == "\\":
            j += 2
        elif c in "'\"`" or text.startswith(("$(", "${", "$'"), j):
            j = _open(text, j, kinds, depths)
        else:
            depths[-1] += (c == kind) - (c == _CLOSER[kind])
            if depths[-1] == 0:
                kinds.pop(), depths.pop()
            j += 1
    return j, True


_CLOSER = {"(": ")", "{": "}"}


def _open(text: str, i: int, kinds: list[str], depths: list[int]) -> int:
    """Push the piece that starts at i; the index its inside starts at (for `$(` and `${`, their `(` or `{`,
    which the scan then counts as depth 1)."""
    kind = "$'" if text.startswith("$'", i) else text[i] if text[i] in "'\"`" else text[i + 1]  # ( or {
    kinds.append(kind)
    depths.append(0)
    return i + (2 if kind == "$'" else 1)


_ARRAY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=\(")
NAME_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
"""The characters a variable's name (and so an array assignment) may start with."""


def array_scan(text: str, i: int) -> tuple[int, bool] | None:
    """If an array assignment starts at i (`ARGS=(`, `ARGS+=(`, a word's start): the index after its `)` and
    whether it closes. Its elements may span lines and carry comments, as bash reads them."""
    m = _ARRAY_RE.match(text, i)
    if m is None:
        return None
    j = m.end()
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
        elif c == "#" and text[j - 1] in " \t\n(":
            end = text.find("\n", j)
            j = len(text) if end == -1 else end
        elif c in "'\"`" or text.startswith(("$(", "${", "$'"), j):
            j, closed = scan(text, j)
            if not closed:
                return len(text), False
        elif c == ")":
            return j + 1, True
        else:
            j += 1
    return len(text), False


def opaque_end(text: str, i: int) -> int | None:
    """If a quote, `$(`, `${` or backtick starts at i: the index after it (the shell reads it as one piece)."""
    if text[i] in "'\"`" or text.startswith(("$(", "${", "$'"), i):
        return _skip_quoted(text, i)
    return None


def raw_words(text: str) -> list[str]:
    """`text` split at unquoted blanks, quotes kept; a `#` that starts a word begins a comment."""
    words: list[str] = []
    i, start = 0, None
    while i < len(text):
        ch = text[i]
        if ch in " \t\n":
            if start is not None:
                words.append(text[start:i])
                start = None
            i += 1
            continue
        if start is None and text.startswith("\\\n", i):  # a line continuation between words (in an array's)
            i += 2
            continue
        if ch == "#" and start is None:  # a comment, up to the newline (inside an array's elements)
            end = text.find("\n", i)
            i = len(text) if end == -1 else end
            continue
        if start is None:
            start = i
            array = array_scan(text, i) if ch in NAME_START else None
            if array is not None:  # `ARGS=(a b)`: one word
                i = array[0]
                continue
        if ch == "\\":
            i += 2
            continue
        opaque = opaque_end(text, i)
        # else letters, digits, most punctuation, a `$` that starts no piece
        i = opaque if opaque is not None else _WORD_PLAIN.match(text, i).end()  # type: ignore[union-attr]
    if start is not None:
        words.append(text[start:])
    return words


_WORD_PLAIN = re.compile(r"(?:[^ \t\n\\'\"`$]|\$(?![({']))+")
_TEXT_PLAIN = re.compile(r"[^\\'\"`$]+")
_DOUBLE_PLAIN = re.compile(r"[^\\`$]+")


_ARRAY_REF_RE = re.compile(r'("?)\$\{([A-Za-z_][A-Za-z0-9_]*)\[([@*])\]\}\1')


def expand_joined(word: str, lookup: Lookup, arrays: Mapping[str, list[str] | None] | None = None) -> str:
    """`word` expanded as an assignment's value or a `${NAME:-default}` reads it: not split, fields joined by a
    blank (`X="${ARGS[@]}"`)."""
    return " ".join(expand(word, lookup, False, arrays))


def expand(word: str, lookup: Lookup, split: bool = True,
           arrays: Mapping[str, list[str] | None] | None = None) -> list[str]:
    """The fields one raw word becomes. `split`: an unquoted expansion is split at blanks (not in assignments).
    `arrays`: the arrays the shell has set (`ARGS=(...)`), for `"${ARGS[@]}"` (a field per element),
    `${ARGS[@]}` and `"${ARGS[*]}"`; None for one set to what lint cannot know. A word whose values add up to
    more than MAX_VALUE characters (`$A$A$A...` of a long `$A`) stays as written."""
    left = [MAX_VALUE]

    def counted(name: str, arithmetic: bool) -> str | None:
        value = lookup(name, arithmetic)
        left[0] -= len(value or "")
        if left[0] < 0:
            raise _TooLong
        return value

    def counted_arrays(name: str) -> list[str] | None:
        elements = arrays.get(name) if arrays is not None else None
        left[0] -= sum(len(e) + 1 for e in elements or ())
        if left[0] < 0:
            raise _TooLong
        return elements

    try:
        return _expand(word, counted, split, counted_arrays)
    except _TooLong:
        return [word]


class _TooLong(Exception):
    """A word's expansion passed MAX_VALUE characters."""


def _expand(word: str, lookup: Lookup, split: bool, array: Callable[[str], list[str] | None]) -> list[str]:
    fields: list[str] = []
    current: list[str] = []  # the pieces of the field being read: a quoted "" is one, so `''` makes a field
    i = 0
    while i < len(word):
        ch = word[i]
        ref = _ARRAY_REF_RE.match(word, i) if ch in '"$' else None
        elements = array(ref.group(2)) if ref else None
        if ref and elements is not None:
            quoted = bool(ref.group(1))
            if quoted and ref.group(3) == "*":
                elements = [" ".join(elements)]
            elif not quoted:
                elements = [f for e in elements for f in _fields(e)]
            for n, element in enumerate(elements):
                if n:
                    fields.append("".join(current))
                    current = []
                current.append(element)
            i = ref.end()
        elif ch == "\\":  # an escaped character; a backslash-newline is a line continuation: nothing
            current.append(word[i + 1:i + 2].replace("\n", ""))
            i += 2
        elif ch == "'":
            end = _skip_quoted(word, i)
            current.append(word[i + 1:end - 1] if word[end - 1:end] == "'" else word[i + 1:end])
            i = end
        elif word.startswith("$'", i):
            end = _skip_quoted(word, i)
            current.append(word[i + 2:end - 1].replace("\\n", "\n").replace("\\t", "\t").replace("\\'", "'"))
            i = end
        elif ch == '"':
            end = _skip_quoted(word, i)
            current.append(_double(word[i + 1:end - 1 if word[end - 1:end] == '"' else end], lookup))
            i = end
        elif ch in "$`":
            value, i, known = _dollar(word, i, lookup)
            if not known or not split:
                current.append(value)
                continue
            pieces = _fields(value)
            if value[:1].isspace() and current:
                fields.append("".join(current))
                current = []
            for n, piece in enumerate(pieces):
                current.append(piece)
                if n < len(pieces) - 1 or value[-1:].isspace():
                    fields.append("".join(current))
                    current = []
        else:  # none of \\ ' " $ `: letters, digits, most punctuation
            end = _TEXT_PLAIN.match(word, i).end()  # type: ignore[union-attr]
            current.append(word[i:end])
            i = end
    if current:
        fields.append("".join(current))
    return fields


def _fields(value: str) -> list[str]:
    """An unquoted expansion split at blanks; a `$(...)` or backtick kept for run time stays one piece."""
    fields, start, i = [], None, 0
    while i < len(value):
        if value[i] in " \t\n":
            if start is not None:
                fields.append(value[start:i])
                start = None
            i += 1
            continue
        start = i if start is None else start
        i = _skip_quoted(value, i) if value[i] == "`" or value.startswith("$(", i) else i + 1
    if start is not None:
        fields.append(value[start:])
    return fields


def _double(body: str, lookup: Lookup) -> str:
    """The text of a double-quoted string: `\\$`, `\\"`, `\\\\`, `` \\` `` escaped, `$VAR` expanded."""
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and body[i + 1:i + 2] in ('$', '"', "\\", "`", "\n"):
            out.append(body[i + 1] if body[i + 1] != "\n" else "")
            i += 2
        elif ch in "$`":
            value, i, _ = _dollar(body, i, lookup)
            out.append(value)
        else:
            plain = _DOUBLE_PLAIN.match(body, i)
            out.append(plain.group() if plain else ch)
            i = plain.end() if plain else i + 1
    return "".join(out)


def _dollar(text: str, i: int, lookup: Lookup) -> tuple[str, int, bool]:
    """The expansion at text[i] (`$NAME`, `${...}`, `$((...))`, `$(...)`, backticks): (value, end, known).
    `known`: the value is what the shell produces (else it is the text as written, for run time)."""
    if text[i] == "`" or text.startswith("$(", i):
        end = _skip_quoted(text, i)
        raw = text[i:end]
        if raw.startswith("$((") and raw.endswith("))"):
            value = _arithmetic(raw[3:-2], lookup)
            if value is not None:
                return value, end, True
        return raw, end, False
    if text.startswith("${", i):
        end = _skip_quoted(text, i)
        value, known = _braced(text[i:end], lookup)
        return value, end, known
    m = NAME_RE.match(text, i + 1)
    if m is None:
        if text[i + 1:i + 2] and text[i + 1] in _SPECIAL:
            return text[i:i + 2], i + 2, False
        return "$", i + 1, True
    value = lookup(m.group(0), False)
    return (text[i:m.end()], m.end(), False) if value is None else (value, m.end(), True)


def _braced(raw: str, lookup: Lookup) -> tuple[str, bool]:
    """`${NAME}`, `${NAME:-default}`, `${NAME-default}`: other forms stay as written."""
    m = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)(.*))?\}", raw, re.DOTALL)
    if m is None or raw.count("${") > MAX_NESTING:  # defaults in defaults: expanded by recursion, so bounded
        return raw, False
    value = lookup(m.group(1), False)
    if value is not None:
        return value, True
    if m.group(2) and not m.group(1).startswith("SLURM_"):  # Slurm sets its own at run time
        return expand_joined(m.group(3), lookup), True
    return raw, False


_ARITH_RE = re.compile(r"[0-9+\-*/%() \t]+")


def _arithmetic(expression: str, lookup: Lookup) -> str | None:
    """`$(( ... ))` with + - * / % and parentheses, when every name in it is known; a batch-expanded
    per-task variable in it makes the whole result that variable's marker."""
    def name(m: re.Match[str]) -> str:
        value = lookup(m.group(0).lstrip("$"), True)
        return f"({value})" if value is not None else m.group(0)

    text = re.sub(r"\$?[A-Za-z_][A-Za-z0-9_]*", name, expression)
    marked = batch_expanded(text)
    if marked:
        return batch_marker(marked)
    if not _ARITH_RE.fullmatch(text):
        return None
    return evaluate(text)
