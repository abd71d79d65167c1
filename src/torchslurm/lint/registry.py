"""Every lint rule, in the order the report runs them: the rule modules, each in its own order.

A new rule is a function decorated with `@rule(code, severities, summary)` (rule.py) in the module of
its topic (a new module goes in `_MODULES`), a row in docs/lint.md's table, and a firing and a
non-firing script in tests/unit/lint/test_rules.py; tests fail until all three exist.
"""

from __future__ import annotations

from torchslurm.lint import batch, directives, launch, launchers, machine, ports, rendezvous, slips
from torchslurm.lint.rule import Rule, rules_in

__all__ = ["RULES", "by_code"]

_MODULES = (directives, launch, rendezvous, launchers, ports, batch, slips, machine)

RULES: tuple[Rule, ...] = rules_in(*_MODULES)
"""Every rule; findings of one severity are reported in this order."""


def by_code() -> dict[str, Rule]:
    """The rules by their codes."""
    return {r.code: r for r in RULES}
