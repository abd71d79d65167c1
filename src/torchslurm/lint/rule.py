"""What a lint rule is: a code, the severities it can report, a one-line summary (the row of
docs/lint.md's table) and its check, declared once with `@rule(...)` above the check.

A check reads `Facts` (the parsed script, its allocation, and what the machine lint runs on says)
and yields `Flag`s; the report (report.py) turns them into `Finding`s named with the rule's code.
Pure: nothing here runs anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType

from torchslurm.jobs.findings import Severity
from torchslurm.lint.allocation import Allocation
from torchslurm.lint.parse import Script

__all__ = ["Facts", "Flag", "Rule", "rule", "rules_in"]


@dataclass(frozen=True)
class Facts:
    """What every rule may read: the script as sbatch and bash read it, and facts derived from it once."""

    script: Script
    allocation: Allocation
    path_exists: Callable[[str], bool] | None = None
    """Whether a folder exists where lint runs (None: lint cannot tell)."""
    syntax_error: tuple[int, str] | None = None
    """`bash -n`'s first syntax error as (line, bash's message), None when it parses or nobody asked bash."""


@dataclass(frozen=True)
class Flag:
    """One thing a rule found; the report gives it the rule's code."""

    severity: Severity
    message: str
    hint: str
    line: int | None = None
    """The script line it is about; the message then starts with `line N: `."""
    about: str | None = None
    """The option or variable it is about, where a rule that supersedes another needs to match it."""


Check = Callable[[Facts], Iterable[Flag]]


@dataclass(frozen=True)
class Rule:
    """One lint code: what it catches, how bad it can be, and the check that finds it."""

    code: str
    severities: tuple[Severity, ...]
    """Every severity the check may report."""
    summary: str
    """What it catches, in one line: the rule's row in docs/lint.md."""
    check: Check = field(repr=False)
    supersedes: tuple[str, ...] = ()
    """Codes whose flags on the same line and about the same option this rule's flags replace (it says the
    same mistake better)."""

    def __call__(self, facts: Facts) -> list[Flag]:
        return list(self.check(facts))


def rule(code: str, severities: tuple[Severity, ...], summary: str,
         supersedes: tuple[str, ...] = ()) -> Callable[[Check], Rule]:
    """Declares the decorated check as the rule `code`; the module's name for it is then that `Rule`."""
    def declare(check: Check) -> Rule:
        return Rule(code, severities, summary, check, supersedes)
    return declare


def rules_in(*modules: ModuleType) -> tuple[Rule, ...]:
    """The rules the modules declare, module by module, each in the order it declares them."""
    return tuple(value for module in modules for value in vars(module).values()
                 if isinstance(value, Rule) and value.check.__module__ == module.__name__)
