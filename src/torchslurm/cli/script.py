"""`torchslurm script [spec flags] [SCRIPT ARGS...]`: print the sbatch script for a job spec.

Also home of the spec flags shared with `submit`: one flag per JobSpec field, spelled like the
field with `-` (`gpus_per_node` -> `--gpus-per-node`); flags win over the `--spec` file.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any

from torchslurm.errors import ConfigError
from torchslurm.jobs import spec as jobspec
from torchslurm.jobs.asked import PREEMPTION_FIELDS, Asked, findings, preemptible_implied
from torchslurm.jobs.findings import Finding
from torchslurm.jobs.spec import JobSpec
from torchslurm.jobs.spelling import command_line, flag

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


def spec_from_args(args: argparse.Namespace, from_file: dict[str, Any] | None = None) -> Asked:
    """The job spec of the --spec file (read here, once, unless `from_file` is what it holds) and the
    flags, which win."""
    if from_file is None:
        from_file = jobspec.read_file(args.spec) if args.spec is not None else {}
    file_keys = frozenset(from_file)
    given: dict[str, Any] = {}
    for f in dataclasses.fields(JobSpec):
        value = getattr(args, f.name, None)
        if f.name in ("script", "args") or value is None:
            continue
        if str(f.type).startswith("Mapping"):
            value = dict(_key_value(item) for item in value)
        given[f.name] = tuple(value) if isinstance(value, list) else value
    if args.script:
        given["script"] = args.script
        given["args"] = tuple(args.args)
    overrides = {"preemptible": True, **given} if preemptible_implied(given, file_keys) else given
    only_in_file = {key for key in file_keys if key not in overrides}
    spelling = command_line(set(jobspec.field_names()) - only_in_file - {"script", "args"})
    # the command as run, for the hint when it names no script
    command = shlex.join(["torchslurm", *getattr(args, "argv", [args.command])])
    source = "flags" if args.spec is None else str(args.spec)
    spec = jobspec.from_mapping({**from_file, **overrides}, source=source, command=command, spelling=spelling)
    return Asked(spec, file_keys, spelling, given, args.spec)


def _key_value(item: str) -> tuple[str, str]:
    key, eq, value = item.partition("=")
    if not eq:
        raise ConfigError(f"--env {item!r} has no '='.", "write --env NAME=VALUE, e.g. --env NCCL_DEBUG=INFO.")
    return key, value


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
    code = report(findings(asked, args.slurm_version, Path.cwd()), args.force)
    if code:
        return code
    sys.stdout.write(render(asked.spec))
    return 0
