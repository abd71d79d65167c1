"""The `torchslurm` command: one module per subcommand; the only place that prints or exits.

Each subcommand module has `register(subparsers)`, which adds its parser and sets
`handler=` to a function `(args) -> int`. Modules are imported lazily by name so that
`torchslurm --help` and the job commands never import torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from torchslurm import __version__
from torchslurm.errors import TorchSlurmError

# Subcommand modules, in the order `--help` lists them.
COMMANDS: tuple[str, ...] = ("run", "train", "sandbox", "script", "submit", "status", "logs", "cancel", "lint",
                             "doctor", "bench")


class _Parser(argparse.ArgumentParser):
    """argparse without the usage dump on a bad flag: the error, then where the options are listed."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message}. HINT: `{self.prog} --help` lists the options.\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="torchslurm",
        description="Distributed PyTorch training on SLURM clusters that just works.",
    )
    parser.add_argument("--version", action="version", version=f"torchslurm {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"torchslurm.cli.{name}").register(subparsers)
    return parser


def setup_logging(verbose: bool) -> None:
    """Attach the one handler torchslurm uses; library modules only create loggers.

    Inside a rank (torchrun or srun task) every line says which rank wrote it.
    """
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID") if "SLURM_STEP_ID" in os.environ else None)
    prefix = f"[torchslurm rank {rank}]" if rank is not None else "[torchslurm]"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prefix} %(levelname)s %(message)s"))
    root = logging.getLogger("torchslurm")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named here, with the subcommand: argparse would blame the top-level parser
        parser.prog = f"torchslurm {args.command}" if args.command else "torchslurm"
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return 2
    setup_logging(args.verbose)
    try:
        return int(args.handler(args))
    except TorchSlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
