"""A job spec as one command asked for it, and what the asking implies.

`Asked` keeps what the spec alone forgets: which fields were given as flags (messages name those
as flags), which keys the --spec file set. From it come the findings about the asking itself: the
preemption flags that turned preemptible on, or that do nothing where it is off, and torchslurm's
Slurm flags given after the script; `findings` gathers them with validate()'s, the files the job
needs and bash's verdict on the rendered script, errors first. The CLI turns its arguments into an
`Asked` and prints the findings.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchslurm.jobs.findings import Finding, by_severity, validate
from torchslurm.jobs.flags import misplaced_flags
from torchslurm.jobs.spec import JobSpec
from torchslurm.jobs.spelling import Spelling, flag

# Fields that only matter for a preemptible job (sbatch.directives renders them only then).
PREEMPTION_FIELDS = ("signal", "grace_s", "requeue", "max_requeues")
BASH_CHECK_TIMEOUT_S = 30.0
"""How long `bash -n` may take on a script before the check gives up (and says nothing)."""


@dataclass(frozen=True)
class Asked:
    """A job spec as one command asked for it: the spec, the keys its --spec file set (the file is
    read once), and how messages name the fields (flags, but keys for what only the file set)."""

    spec: JobSpec
    file_keys: frozenset[str]
    spelling: Spelling
    given: Mapping[str, Any]
    """The fields the command line set, with their values (`script` and `args` when it named the script)."""
    spec_file: Path | None = None
    """The --spec file, when one was read."""


def preemption_flags(given: Mapping[str, Any]) -> list[str]:
    """The preemption flags given on the command line, as spelled there."""
    return [flag(name, given[name]) for name in PREEMPTION_FIELDS if given.get(name) is not None]


def preemptible_implied(given: Mapping[str, Any], file_keys: frozenset[str]) -> bool:
    """--signal/--grace-s/--requeue/--max-requeues given, preemptible said nowhere: they turn it on
    (without it none of them reaches the script, and the user asked for them)."""
    return bool(preemption_flags(given)) and given.get("preemptible") is None and "preemptible" not in file_keys


def preemption_findings(asked: Asked) -> list[Finding]:
    """Say that preemption flags turned on preemptible, or that they do nothing where it is off."""
    spec, given, flags = asked.spec, asked.given, preemption_flags(asked.given)
    if spec.preemptible and preemptible_implied(given, asked.file_keys):
        return [Finding("info", "preemptible-implied",
                        f"{', '.join(flags)} turned on --preemptible: the script asks for "
                        f"--signal={spec.signal}@{spec.grace_s}, {flag('requeue', spec.requeue)} "
                        "and --open-mode=append.", "pass --preemptible to say so, or drop "
                        f"{', '.join(flags)} for a job that is not preemptible")]
    if spec.preemptible:
        return []
    unused = [flag(name, given[name]) if given.get(name) is not None else f"{name} (in {asked.spec_file})"
              for name in PREEMPTION_FIELDS if given.get(name) is not None or name in asked.file_keys]
    if not unused:
        return []
    verb = "takes" if len(unused) == 1 else "take"
    return [Finding("warning", "preemption-off",
                    f"{', '.join(unused)} {verb} effect only for a preemptible job, and preemptible is off; "
                    "the script has no #SBATCH --signal or --requeue.",
                    "pass --preemptible (preemptible: true in the spec file), or drop them")]


def findings(asked: Asked, slurm_version: str | None, cwd: Path, submitting: bool = False) -> list[Finding]:
    """validate()'s findings, an error for each Slurm flag given after the script, bash's verdict
    on the rendered script (a --setup line with an unbalanced quote), and the files the job needs
    (looked up from `cwd`, where sbatch runs), errors first."""
    # imported here: every subcommand's parser reads PREEMPTION_FIELDS, and start-up stays small
    from torchslurm.jobs.sbatch import render
    from torchslurm.jobs.submit import missing_log_dirs, script_missing

    spec = asked.spec
    misplaced = misplaced_flags(asked.given["script"], asked.given["args"]) if "script" in asked.given else []
    local = script_missing(spec, cwd, submitting) + preemption_findings(asked)
    if not submitting:  # submit creates the log directories instead (submit.prepare)
        local += missing_log_dirs(spec, cwd)
    checked = validate(spec, slurm_version, asked.spelling)
    return by_severity([*misplaced, *local, *bash_syntax(render(spec)), *checked])


def bash_syntax(script_text: str) -> list[Finding]:
    """`bash -n` on the script: a syntax error found now, not after the job waited in the queue."""
    try:
        result = subprocess.run(["bash", "-n"], input=script_text, capture_output=True, encoding="utf-8",
                                errors="replace", timeout=BASH_CHECK_TIMEOUT_S)  # the UTF-8 the script is written in
    except (OSError, subprocess.TimeoutExpired):
        return []  # no bash here, or a stuck one: sbatch's node will say it
    if result.returncode == 0:
        return []
    said = " ".join(line.strip() for line in result.stderr.splitlines() if line.strip())
    return [Finding("error", "shell-syntax", f"the rendered script is not valid bash: {said}",
                    "check the setup lines for an unbalanced quote or bracket; "
                    "`torchslurm script --force ...` prints the script anyway")]
