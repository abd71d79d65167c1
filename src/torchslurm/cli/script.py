"""`torchslurm script [spec flags] [SCRIPT ARGS...]`: print the sbatch script for a job spec.

Also home of the spec flags shared with `submit`: one flag per JobSpec field, spelled like the
field with `-` (`gpus_per_node` -> `--gpus-per-node`); flags win over the `--spec` file.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchslurm.errors import ConfigError
from torchslurm.jobs import spec as jobspec
from torchslurm.jobs.findings import Finding, by_severity, validate
from torchslurm.jobs.spec import JobSpec
from torchslurm.jobs.spelling import Spelling, command_line, flag

# Spec fields with a fixed set of values, listed in --help (`--launch {srun,torchrun}`).
CHOICES = {"launch": jobspec.LAUNCH_MODES, "backend": jobspec.BACKENDS, "gpu_flag": jobspec.GPU_FLAGS,
           "signal": jobspec.SIGNALS}


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, metavar="FILE", help="job spec file (YAML or TOML)")
    group = parser.add_argument_group("job spec fields (override the --spec file)")
    for f in dataclasses.fields(JobSpec):
        if f.name in ("script", "args"):
            continue
        option, kind = flag(f.name), str(f.type)
        doc = jobspec.field_help(f.name).replace("%", "%%")  # argparse %-formats help strings (`%x-%j.out`)
        if f.name in PREEMPTION_FIELDS:
            doc += " Given as a flag, it turns on --preemptible (unless --no-preemptible)."
        if kind == "bool":
            group.add_argument(option, action=argparse.BooleanOptionalAction, default=None, help=doc)
        elif kind.startswith("tuple"):
            group.add_argument(option, action="append", metavar="LINE", help=doc + " (repeatable)")
        elif kind.startswith("Mapping"):
            group.add_argument(option, action="append", metavar="KEY=VALUE", help=doc + " (repeatable)")
        elif f.name in CHOICES:  # not argparse's choices=: jobspec's own message, and signal takes any case
            group.add_argument(option, default=None, metavar="{" + ",".join(CHOICES[f.name]) + "}", help=doc)
        else:
            conv = int if kind.startswith("int") else float if kind.startswith("float") else str
            group.add_argument(option, type=conv, default=None, metavar=f.name.upper(), help=doc)
    parser.add_argument("--slurm-version", default=None, metavar="VERSION",
                        help="check GPU flags against this Slurm version (e.g. 22.05), as printed by sbatch --version")
    parser.add_argument("--force", action="store_true", help="go on despite errors in the spec")
    parser.add_argument("script", nargs="?", help="training script (overrides `script` in --spec)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the training script")


# Arguments after the script are the script's (as with srun and torchrun). These spec flags are
# Slurm's and almost never a training script's own, so one of them there is a misplaced flag.
_SLURM_FLAGS = frozenset(flag(name) for name in (
    "nodes", "gpus_per_node", "tasks_per_node", "nproc_per_node", "cpus_per_task", "mem", "time", "partition",
    "account", "qos", "constraint", "nodelist", "exclude", "preemptible", "requeue", "max_requeues", "gpu_flag",
    "per_rank_output", "spec", "slurm_version", "no_preemptible", "no_requeue", "no_per_rank_output", "array",
    "grace_s"))


def misplaced_flags(script: str, script_args: list[str]) -> list[Finding]:
    """An error for each of torchslurm's Slurm flags given after the script (the script would get it)."""
    flags = [arg.split("=", 1)[0] for arg in script_args]
    return [Finding("error", "misplaced-flag", f"{flag} comes after {script}, so {script} gets it and the job "
                    "spec does not.", f"put torchslurm's flags before the script ({flag} ... "
                    f"{script} ...); if {script} itself takes {flag}, give --force before {script}")
            for flag in dict.fromkeys(flags) if flag in _SLURM_FLAGS]


# Fields that only matter for a preemptible job (sbatch.directives renders them only then).
PREEMPTION_FIELDS = ("signal", "grace_s", "requeue", "max_requeues")


@dataclass(frozen=True)
class Asked:
    """A job spec as one command asked for it: the spec, the keys its --spec file set (the file is
    read once), and how messages name the fields (flags, but keys for what only the file set)."""

    spec: JobSpec
    file_keys: frozenset[str]
    spelling: Spelling


def preemption_flags(args: argparse.Namespace) -> list[str]:
    """The preemption flags given on the command line, as spelled there."""
    return [flag(name, getattr(args, name)) for name in PREEMPTION_FIELDS if getattr(args, name, None) is not None]


def preemptible_implied(args: argparse.Namespace, file_keys: frozenset[str]) -> bool:
    """--signal/--grace-s/--requeue/--max-requeues given, preemptible said nowhere: they turn it on
    (without it none of them reaches the script, and the user asked for them)."""
    return (bool(preemption_flags(args)) and getattr(args, "preemptible", None) is None
            and "preemptible" not in file_keys)


def preemption_findings(asked: Asked, args: argparse.Namespace) -> list[Finding]:
    """Say that preemption flags turned on preemptible, or that they do nothing where it is off."""
    spec, flags = asked.spec, preemption_flags(args)
    if spec.preemptible and preemptible_implied(args, asked.file_keys):
        return [Finding("info", "preemptible-implied",
                        f"{', '.join(flags)} turned on --preemptible: the script asks for "
                        f"--signal={spec.signal}@{spec.grace_s}, {flag('requeue', spec.requeue)} "
                        "and --open-mode=append.", "pass --preemptible to say so, or drop "
                        f"{', '.join(flags)} for a job that is not preemptible")]
    if spec.preemptible:
        return []
    unused = [flag(name, getattr(args, name)) if getattr(args, name, None) is not None else f"{name} (in {args.spec})"
              for name in PREEMPTION_FIELDS if getattr(args, name, None) is not None or name in asked.file_keys]
    if not unused:
        return []
    verb = "takes" if len(unused) == 1 else "take"
    return [Finding("warning", "preemption-off",
                    f"{', '.join(unused)} {verb} effect only for a preemptible job, and preemptible is off; "
                    "the script has no #SBATCH --signal or --requeue.",
                    "pass --preemptible (preemptible: true in the spec file), or drop them")]


def spec_from_args(args: argparse.Namespace) -> Asked:
    """The job spec of the --spec file (read here, once) and the flags, which win."""
    from_file = jobspec.read_file(args.spec) if args.spec is not None else {}
    file_keys = frozenset(from_file)
    overrides: dict[str, Any] = {"preemptible": True} if preemptible_implied(args, file_keys) else {}
    for f in dataclasses.fields(JobSpec):
        value = getattr(args, f.name, None)
        if f.name in ("script", "args") or value is None:
            continue
        if str(f.type).startswith("Mapping"):
            value = dict(_key_value(item) for item in value)
        overrides[f.name] = tuple(value) if isinstance(value, list) else value
    if args.script:
        overrides["script"] = args.script
        overrides["args"] = tuple(args.args)
    only_in_file = {key for key in file_keys if key not in overrides}
    spelling = command_line(set(jobspec.field_names()) - only_in_file - {"script", "args"})
    # the command as run, for the hint when it names no script
    command = shlex.join(["torchslurm", *getattr(args, "argv", [args.command])])
    source = "flags" if args.spec is None else str(args.spec)
    spec = jobspec.from_mapping({**from_file, **overrides}, source=source, command=command, spelling=spelling)
    return Asked(spec, file_keys, spelling)


def _key_value(item: str) -> tuple[str, str]:
    key, eq, value = item.partition("=")
    if not eq:
        raise ConfigError(f"--env {item!r} has no '='.", "write --env NAME=VALUE, e.g. --env NCCL_DEBUG=INFO.")
    return key, value


def findings_of(asked: Asked, args: argparse.Namespace, slurm_version: str | None,
                submitting: bool = False) -> list[Finding]:
    """validate()'s findings, an error for each Slurm flag given after the script, bash's verdict
    on the rendered script (a --setup line with an unbalanced quote), and the files the job needs."""
    from torchslurm.jobs.sbatch import render
    from torchslurm.jobs.submit import missing_log_dirs, script_missing

    spec = asked.spec
    misplaced = misplaced_flags(args.script, args.args) if args.script else []
    local = script_missing(spec, Path.cwd(), submitting) + preemption_findings(asked, args)
    if not submitting:  # submit creates the log directories instead (submit.prepare)
        local += missing_log_dirs(spec, Path.cwd())
    checked = validate(spec, slurm_version, asked.spelling)
    return by_severity([*misplaced, *local, *bash_syntax(render(spec)), *checked])


def bash_syntax(script_text: str) -> list[Finding]:
    """`bash -n` on the script: a syntax error found now, not after the job waited in the queue."""
    try:
        result = subprocess.run(["bash", "-n"], input=script_text, capture_output=True, text=True, encoding="utf-8",
                                errors="replace", timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []  # no bash here: sbatch's node will say it
    if result.returncode == 0:
        return []
    said = " ".join(line.strip() for line in result.stderr.splitlines() if line.strip())
    return [Finding("error", "shell-syntax", f"the rendered script is not valid bash: {said}",
                    "check the setup lines for an unbalanced quote or bracket; "
                    "`torchslurm script --force ...` prints the script anyway")]


def report(findings: list[Finding], force: bool) -> int:
    """Print findings to stderr; 2 when there are errors (unless forced)."""
    for finding in findings:
        print(finding, file=sys.stderr)
    errors = sum(f.severity == "error" for f in findings)
    if errors and not force:
        print(f"error: {errors} error(s) in the job spec; fix them or pass --force", file=sys.stderr)
        return 2
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "script", help="print the sbatch script for a job spec (no Slurm needed)",
        description="Render a job spec (file and/or flags) into a checked sbatch script on stdout; "
        "findings (errors, warnings, the effective batch size) go to stderr.")
    add_spec_arguments(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from torchslurm.jobs.sbatch import render

    asked = spec_from_args(args)
    code = report(findings_of(asked, args, args.slurm_version), args.force)
    if code:
        return code
    sys.stdout.write(render(asked.spec))
    return 0
