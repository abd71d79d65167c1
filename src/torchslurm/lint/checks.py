"""lint(text) -> findings for a hand-written sbatch script: the usual multi-node mistakes.

Pure: parse.parse() reads the script (its `#SBATCH` directives and its srun / torchrun / python
lines), and every rule of the registry (lint.registry) looks at it: the directives' and the batch
shell's (directives), the launch lines' (launch, launchers), fixed ports (ports) and shell slips
(slips). Nothing is executed.
"""

from __future__ import annotations

from collections.abc import Callable

from torchslurm.jobs.findings import Finding
from torchslurm.lint import directives, launch, launchers, ports, slips  # noqa: F401  (they declare the rules)
from torchslurm.lint.allocation import gpus_per_node, tasks_per_node
from torchslurm.lint.parse import parse
from torchslurm.lint.registry import Context, run

__all__ = ["gpus_per_node", "lint", "parse", "tasks_per_node"]

SyntaxCheck = Callable[[str], "tuple[int, str] | None"]
"""Reads a script as bash would (`bash -n`): the first syntax error as (line, bash's message), or None."""


def lint(text: str, path_exists: Callable[[str], bool] | None = None,
         syntax: SyntaxCheck | None = None) -> list[Finding]:
    """All pitfalls found in `text`, errors first. `path_exists` lets the CLI check log directories,
    `syntax` lets it ask bash itself whether the script parses (cli/lint.py: `bash -n`)."""
    return run(Context(parse(text), path_exists, syntax(text) if syntax is not None else None))
