"""Slurm hostlist expressions: expand `n[01-03],gpu[1,5]` to names, compress names back, and
parse the run-length counts of SLURM_TASKS_PER_NODE / SLURM_JOB_CPUS_PER_NODE (`2(x3),1`).

Pure, no torch. The semantics are those of Slurm 22.05's `scontrol show hostnames` and
`scontrol show hostlist` (src/common/hostlist.c), checked against the real client in
tests/unit/test_hostlist.py. Where Slurm silently turns a malformed expression into nonsense
names (`n[1-3` gives `n]`, `n[ 1-3]` gives `n01 n02 n03`, `n[+1]`, `n[1-]`, a stray `]`) we
raise HostlistError instead: a wrong node name makes every rank wait for a master that does
not exist, so refusing is the only useful answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from torchslurm.errors import HostlistError

__all__ = ["MAX_HOSTS", "MAX_RANGE", "compress", "expand", "expand_counts"]

MAX_RANGE = 64 * 1024
"""Slurm's MAX_RANGE: a single `lo-hi` range may hold at most this many numbers."""

MAX_HOSTS = 64 * 1024
"""Default cap on a whole expansion; far above any real cluster, far below a memory blow-up."""

# Slurm 22.05 ULONG_MAX arithmetic breaks at 2**64 - 1 (the last number of a range never ends).
_MAX_NUMBER = 2**64 - 2
# Outside brackets Slurm splits on these; inside brackets they are an error for us.
_SEPARATORS = frozenset(", \t\n")
_ITEM = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_COUNT = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")
_HINT_NAMES = 4  # full names shown in a hint
_TRAILING_NUMBER = re.compile(r"(.*?)([0-9]{1,18})", re.DOTALL)


@dataclass(frozen=True)
class _Token:
    """One comma-separated element: literals[0] [groups[0]] literals[1] ... [groups[-1]]."""

    literals: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]

    def count(self) -> int:
        total = 1
        for group in self.groups:
            total *= len(group)
        return total


def expand(expression: str, max_hosts: int = MAX_HOSTS) -> list[str]:
    """Expand a Slurm hostlist expression into host names, in Slurm's order, duplicates kept.

    `expand("rack[1-2]-n[01-02]")` -> rack1-n01, rack1-n02, rack2-n01, rack2-n02. With three or
    more bracket groups Slurm's order is peculiar (the second-to-last group is outermost, the
    last innermost: `a[1-2]b[3-4]c[5-6]` -> a1b3c5, a1b3c6, a2b3c5, ...); we reproduce it.
    """
    tokens = [_parse_token(expression, text) for text in _split_tokens(expression)]
    total = sum(token.count() for token in tokens)
    if total > max_hosts:
        raise HostlistError(
            f"hostlist {expression!r} expands to {total} hosts, more than the limit of {max_hosts}.",
            "check the ranges for a typo (an extra digit), or pass a larger max_hosts."
        )
    hosts: list[str] = []
    for token in tokens:
        hosts.extend(_expand_token(token))
    return hosts


def compress(hosts: Iterable[str]) -> str:
    """Compress host names into an expression; `expand(compress(h)) == list(h)` always holds.

    Like `scontrol show hostlist`: runs of neighbouring names with the same prefix share one
    bracket (`n1,n2,n4` -> `n[1-2,4]`), nothing is sorted or de-duplicated, so order survives.
    """
    parts: list[str] = []
    run_prefix: str | None = None
    run_numbers: list[str] = []
    for host in hosts:
        _check_host(host)
        match = _TRAILING_NUMBER.fullmatch(host)
        if match is None:
            _flush(parts, run_prefix, run_numbers)
            run_prefix, run_numbers = None, []
            parts.append(host)
            continue
        prefix, number = match.group(1), match.group(2)
        if prefix != run_prefix:
            _flush(parts, run_prefix, run_numbers)
            run_prefix, run_numbers = prefix, []
        run_numbers.append(number)
    _flush(parts, run_prefix, run_numbers)
    return ",".join(parts)


def expand_counts(value: str, max_total: int = MAX_HOSTS) -> list[int]:
    """Expand Slurm's run-length counts: `expand_counts("2(x3),1")` -> [2, 2, 2, 1].

    This is the format of SLURM_TASKS_PER_NODE, SLURM_JOB_CPUS_PER_NODE and
    SLURM_STEP_TASKS_PER_NODE: one entry per node, `N(xK)` meaning K nodes with N each.
    """
    counts: list[int] = []
    for item in value.split(","):
        match = _COUNT.fullmatch(item.strip())
        if match is None:
            raise HostlistError(
                f"count list {value!r}: element {item!r} is not `N` or `N(xK)`.",
                "pass the value of SLURM_TASKS_PER_NODE / SLURM_JOB_CPUS_PER_NODE unchanged, "
                "e.g. '2(x3),1'."
            )
        repeat = int(match.group(2) or 1)
        if repeat == 0 or len(counts) + repeat > max_total:
            raise HostlistError(
                f"count list {value!r}: repeat in {item!r} must be between 1 and {max_total} nodes in all.",
                "pass the value Slurm set, e.g. '2(x3),1'."
            )
        counts.extend([int(match.group(1))] * repeat)
    return counts


def _split_tokens(expression: str) -> Iterator[str]:
    """Split on separators outside brackets, refusing unbalanced or nested brackets."""
    depth, start = 0, 0
    for pos, char in enumerate(expression):
        if char == "[":
            if depth:
                raise _error(expression, f"nested '[' at position {pos}", "brackets cannot be nested")
            depth = 1
        elif char == "]":
            if not depth:
                raise _error(expression, f"']' without '[' at position {pos}", "balance the brackets")
            depth = 0
        elif char in _SEPARATORS:
            if depth and char != ",":
                raise _error(expression, f"whitespace inside brackets at position {pos}",
                             "write ranges without spaces, e.g. n[1,3-5]")
            if not depth:
                if pos > start:
                    yield expression[start:pos]
                start = pos + 1
    if depth:
        raise _error(expression, "'[' is never closed", "close every '[' with ']'")
    if len(expression) > start:
        yield expression[start:]


def _parse_token(expression: str, text: str) -> _Token:
    pieces = re.split(r"\[([^\]]*)\]", text)
    literals, bodies = tuple(pieces[0::2]), pieces[1::2]
    groups = tuple(_parse_group(expression, body) for body in bodies)
    if bodies and literals[-1]:
        # Slurm: after the last ']' only a separator may follow (hostlist.c, "Invalid hostlist"), so a
        # domain or suffix cannot be bracketed: the names must be listed in full.
        total = _Token(literals, groups).count()
        first = _Token(literals, tuple(group[:_HINT_NAMES] for group in groups))  # a few names, not billions
        shown = ",".join(name + literals[-1] for name in _expand_token(first)[:_HINT_NAMES])
        more = f" and the {total - _HINT_NAMES} others" if total > _HINT_NAMES else ""
        raise _error(expression, f"{literals[-1]!r} follows the last ']' in {text!r}",
                     f"Slurm cannot bracket a suffix: list the full names, e.g. {shown!r}{more}")
    return _Token(literals, groups)


def _parse_group(expression: str, body: str) -> tuple[str, ...]:
    """`01-03,7` -> ('01', '02', '03', '7'); each range is zero-padded to the width of its low end."""
    names: list[str] = []
    for item in body.split(","):
        match = _ITEM.fullmatch(item)
        if match is None:
            raise _error(expression, f"range {item!r} in [{body}] is not `N` or `LO-HI` with digits only",
                         "use ranges like [1-4] or [01-08,12]")
        low_text, high_text = match.group(1), match.group(2) or match.group(1)
        low, high = int(low_text), int(high_text)
        if low > high:
            raise _error(expression, f"range {item!r} runs backwards ({low} > {high})",
                         f"write it as [{high_text}-{low_text}] or list the numbers")
        if high > _MAX_NUMBER:
            raise _error(expression, f"number {high} in {item!r} is larger than {_MAX_NUMBER}",
                         "check the range for a typo")
        if high - low + 1 > MAX_RANGE:
            size = high - low + 1
            raise _error(expression, f"range {item!r} holds {size} numbers, Slurm allows {MAX_RANGE}",
                         "split the range or check it for a typo")
        width = len(low_text)
        names.extend(f"{number:0{width}d}" for number in range(low, high + 1))
    return tuple(names)


def _expand_token(token: _Token) -> list[str]:
    if not token.groups:
        return [token.literals[0]]
    return _push(list(token.literals[:-1]), list(token.groups[:-1]), token.groups[-1])


def _push(literals: list[str], groups: list[tuple[str, ...]], last: tuple[str, ...]) -> list[str]:
    """Slurm's _push_range_list: the prefix's last group loops outermost, recursing leftwards,
    and the token's last group varies fastest. literals has one more entry than groups."""
    if not groups:
        return [literals[0] + name for name in last]
    hosts: list[str] = []
    for value in groups[-1]:
        merged = [*literals[:-2], literals[-2] + value + literals[-1]]
        hosts.extend(_push(merged, groups[:-1], last))
    return hosts


def _flush(parts: list[str], prefix: str | None, numbers: list[str]) -> None:
    if prefix is None or not numbers:
        return
    if len(numbers) == 1:
        parts.append(prefix + numbers[0])
        return
    parts.append(f"{prefix}[{','.join(_ranges(numbers))}]")


def _ranges(numbers: list[str]) -> Iterator[str]:
    """Greedy runs where each next number is the previous + 1 at the run's first width."""
    start = 0
    for index in range(1, len(numbers) + 1):
        width = len(numbers[start])
        expected = f"{int(numbers[index - 1]) + 1:0{width}d}"
        if index == len(numbers) or numbers[index] != expected:
            low, high = numbers[start], numbers[index - 1]
            yield low if index - 1 == start else f"{low}-{high}"
            start = index


def _check_host(host: str) -> None:
    if not host or any(char in _SEPARATORS or char in "[]" for char in host):
        raise HostlistError(
            f"host name {host!r} cannot be written in a hostlist: it is empty or holds a separator "
            "(comma, space, tab, newline) or a bracket.", "pass plain host names such as 'node01'."
        )


def _error(expression: str, problem: str, hint: str) -> HostlistError:
    return HostlistError(f"invalid hostlist {expression!r}: {problem}.", f"{hint}.")
