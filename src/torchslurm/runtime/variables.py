"""Reading the launchers' variables strictly: whole numbers as Slurm and torchrun write them, ranks
inside their sizes, sets of variables that come together. Every error names the variable and its value."""

from __future__ import annotations

import re
from collections.abc import Mapping

from torchslurm.errors import EnvError

_WHOLE_NUMBER = re.compile(r"[-+]?[0-9]{1,18}")  # 18 digits: past any count, rank, id or port


def is_digits(text: str) -> bool:
    """`text` is 1 to 18 ASCII digits: a count, id or port that int() reads as written. str.isdigit()
    is not this: it takes `²`, which int() refuses, and other scripts' digits, which int() reads and
    Slurm and the launchers do not; and 5,000 digits are past int()'s limit."""
    return len(text) <= 18 and text.isascii() and text.isdigit()  # "".isdigit() is False


def whole_number(name: str, value: str) -> int:
    """A whole number as Slurm and torchrun write one: up to 18 ASCII digits, optionally signed. Python's int() would
    also take `12_0` (as 120) and non-ASCII digits, which would silently name another job or rank."""
    text = value.strip()
    if _WHOLE_NUMBER.fullmatch(text) is None:
        raise EnvError(f"{name}={value!r} is not an integer.", f"unset {name} or set it to a whole number.")
    return int(text)


def first_number(environ: Mapping[str, str], *names: str, default: int) -> int:
    """whole_number() of the first of `names` that is set, an error naming that one; `default` when none is."""
    name = next((name for name in names if name in environ), None)
    return default if name is None else whole_number(name, environ[name])


def first_set(environ: Mapping[str, str], *names: str, default: str | None = None) -> str:
    """The value of the first of `names` that is set (Slurm spells some facts two ways across versions)."""
    for name in names:
        if name in environ:
            return environ[name]
    if default is None:
        raise EnvError(f"none of {', '.join(names)} is set.",
                       "srun sets them in every task; start the program with srun, not with a partial copy "
                       "of a Slurm environment.")
    return default


def require(environ: Mapping[str, str], names: tuple[str, ...], who: str, hint: str) -> None:
    """All of `names` are set, or an error naming the missing ones and the values of the others."""
    missing = [n for n in names if n not in environ]
    if missing:
        present = ", ".join(f"{n}={environ[n]}" for n in names if n in environ) or "none of them"
        raise EnvError(f"{who}, but {', '.join(missing)} not set ({present}): half a torchrun environment.", hint)


def check_rank(name: str, value: int, size_name: str, size: int) -> None:
    """0 <= value < size, and size >= 1."""
    if size < 1:
        raise EnvError(f"{size_name}={size} must be at least 1.", "check the launcher's arguments.")
    if not 0 <= value < size:
        raise EnvError(
            f"{name}={value} is outside 0..{size - 1} ({size_name}={size}).",
            "the launcher's variables disagree; do not set rank variables by hand in job scripts."
        )
