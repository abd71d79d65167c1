"""lint(text) -> findings for a hand-written sbatch script: every registered rule (registry.py) run on it.

Pure: parse.parse() reads the script; each rule reads the same `Facts` and returns `Flag`s; a rule that
supersedes another drops that rule's flags on the same line about the same option; the flags become
`Finding`s named with their rule's code, errors first. Nothing is executed: the CLI passes in what
bash says of the script (`bash -n`) and whether a folder exists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torchslurm.jobs.findings import Finding, by_severity
from torchslurm.lint.allocation import Allocation
from torchslurm.lint.parse import parse
from torchslurm.lint.registry import RULES
from torchslurm.lint.rule import Facts, Flag, Rule

__all__ = ["SyntaxCheck", "lint", "run_rules"]

SyntaxCheck = Callable[[str], "tuple[int, str] | None"]
"""Reads a script as bash would (`bash -n`): the first syntax error as (line, bash's message), or None."""


def lint(text: str, path_exists: Callable[[str], bool] | None = None,
         syntax: SyntaxCheck | None = None) -> list[Finding]:
    """All pitfalls found in `text`, errors first. `path_exists` lets the CLI check log directories,
    `syntax` lets it ask bash itself whether the script parses (cli/lint.py: `bash -n`)."""
    script = parse(text)
    facts = Facts(script, Allocation.of(script.directives), path_exists,
                  syntax(text) if syntax is not None else None)
    return run_rules(facts, RULES)


def run_rules(facts: Facts, rules: Sequence[Rule]) -> list[Finding]:
    """What `rules` find in `facts`, errors first, each severity in the rules' order."""
    flags = {r.code: r(facts) for r in rules}
    for r in rules:
        said = {(f.line, f.about) for f in flags[r.code]}
        for code in r.supersedes:
            flags[code] = [f for f in flags.get(code, []) if (f.line, f.about) not in said]
    found = []
    for r in rules:
        for f in flags[r.code]:
            assert f.severity in r.severities, f"{r.code} flagged {f.severity}, not one of {r.severities}"
            found.append(_finding(r.code, f))
    return by_severity(found)


def _finding(code: str, flag: Flag) -> Finding:
    message = flag.message if flag.line is None else f"line {flag.line}: {flag.message}"
    return Finding(flag.severity, code, message, flag.hint)
