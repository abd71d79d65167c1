"""`torchslurm lint SCRIPT...`: the seeds' pitfalls in hand-written sbatch scripts. Exit 1 on errors."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from torchslurm.errors import ConfigError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "lint", help="check hand-written sbatch scripts for the usual multi-node mistakes",
        description="Reads #SBATCH directives and srun/torchrun/python lines; reports ntasks/GPU/nproc "
        "mismatches, hard-coded MASTER_ADDR/PORT, per-rank NIC case blocks, unreachable signals and more. "
        "Exit status 1 when an error is found.")
    parser.add_argument("scripts", nargs="+", type=Path, metavar="SCRIPT")
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from torchslurm.lint import lint

    worst = 0
    for path in args.scripts:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}. HINT: check the path.") from exc
        findings = lint(text, path_exists=os.path.isdir)
        for f in findings:
            print(f"{path}: {f}")
        if any(f.severity == "error" for f in findings) or (args.strict and findings):
            worst = 1
        if not findings:
            print(f"{path}: ok")
    return worst
