"""Every lint rule, declared once: its code, the severities it reports, a one-line summary and its
check. A rule is a function decorated with `@rule(...)`; `run()` asks each rule in the order they were
declared, and `docs/lint.md`'s table lists exactly these codes (tests/unit/lint/test_registry.py).

A rule may `yield_to` other rules: its finding on a line is dropped when one of those reported the
same line, because theirs says it better (an `#SBATCH -nodes=3` is a one-dash slip, not a bad value
of `-n`). That is the only way one rule silences another."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from torchslurm.jobs.findings import Finding, by_severity
from torchslurm.lint.parse import Script
from torchslurm.severity import Severity


@dataclass(frozen=True)
class Context:
    """What a rule may look at: the parsed script, and the facts only the caller can get."""

    script: Script
    path_exists: Callable[[str], bool] | None = None
    """Whether a folder exists where lint runs (log folders); None: unknown."""
    syntax_error: tuple[int, str] | None = None
    """bash's first syntax error in the script (line, message), when bash was asked."""


Check = Callable[[Context], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    code: str
    severities: tuple[Severity, ...]
    summary: str
    check: Check
    yield_to: tuple[str, ...] = ()


RULES: dict[str, Rule] = {}
"""Code -> rule, in the order the rules run."""


def rule(code: str, *severities: Severity, summary: str, yield_to: tuple[str, ...] = ()) -> Callable[[Check], Check]:
    """Register the decorated check as the rule `code`."""
    def register(check: Check) -> Check:
        assert code not in RULES, f"lint rule {code} is declared twice"
        RULES[code] = Rule(code, severities, summary, check, yield_to)
        return check
    return register


_LINE = re.compile(r"^line (\d+):")


def line_of(finding: Finding) -> int | None:
    """The script line a finding is about (its message starts `line N:`), if any."""
    m = _LINE.match(finding.message)
    return int(m.group(1)) if m else None


def run(context: Context, rules: Iterable[Rule] | None = None) -> list[Finding]:
    """Every rule's findings, errors first. A finding must carry its rule's code and one of its
    severities: a rule reports only for itself."""
    chosen = list(RULES.values() if rules is None else rules)
    found: dict[str, list[Finding]] = {}
    for r in chosen:
        found[r.code] = list(r.check(context))
        wrong = [f for f in found[r.code] if f.code != r.code or f.severity not in r.severities]
        assert not wrong, f"lint rule {r.code} reported {wrong}"
    for r in chosen:
        taken = {line_of(f) for code in r.yield_to for f in found.get(code, [])} - {None}
        found[r.code] = [f for f in found[r.code] if line_of(f) not in taken]
    return by_severity([f for r in chosen for f in found[r.code]])
