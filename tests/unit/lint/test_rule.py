"""A rule is declared once, with @rule above its check; rules_in collects a module's own rules in order."""

from __future__ import annotations

from types import ModuleType

from torchslurm.lint import launch
from torchslurm.lint.allocation import Allocation
from torchslurm.lint.parse import parse
from torchslurm.lint.rule import Facts, Flag, Rule, rule, rules_in


def test_the_decorator_makes_the_check_a_rule_that_returns_its_flags() -> None:
    @rule("always", ("info",), "always says so.")
    def always(x: Facts) -> list[Flag]:
        return [Flag("info", f"{len(x.script.launches)} launch(es)", "none needed")]

    script = parse("#!/bin/bash\nsrun python t.py\n")
    assert isinstance(always, Rule) and (always.code, always.severities, always.summary, always.supersedes) == (
        "always", ("info",), "always says so.", ())
    assert always(Facts(script, Allocation.of(script.directives))) == [Flag("info", "1 launch(es)", "none needed")]

    @rule("better", ("error",), "says it better.", supersedes=("always",))
    def better(x: Facts) -> list[Flag]:
        return []

    assert (better.code, better.severities, better.summary, better.supersedes) == (
        "better", ("error",), "says it better.", ("always",))


def test_rules_in_takes_each_modules_own_rules_in_order_not_the_ones_it_imports() -> None:
    module = ModuleType("borrowing")
    module.imported = launch.tasks_vs_gpus  # type: ignore[attr-defined]
    assert rules_in(module) == ()
    codes = [r.code for r in rules_in(launch)]
    assert codes[:2] == ["deprecated-launch", "python-without-srun"] and len(codes) == 10
