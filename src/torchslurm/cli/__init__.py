"""The `torchslurm` command: one module per subcommand; the only place that prints or exits.

Each subcommand module has `register(subparsers)`, which adds its parser and sets
`handler=` to a function `(args) -> int`. Modules are imported lazily by name so that
`torchslurm --help` and the job commands never import torch.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from torchslurm._version import __version__
from torchslurm.cli.ending import exit_process
from torchslurm.errors import TorchSlurmError, render

# Subcommand modules, in the order `--help` lists them.
COMMANDS: tuple[str, ...] = ("run", "train", "export", "sandbox", "script", "submit", "sweep", "status", "stacks",
                             "logs", "cancel", "results", "lint", "doctor", "bench")


class _Parser(argparse.ArgumentParser):
    """argparse without the usage dump on a bad flag: the error, then where the options are listed.

    Abbreviations are off (for subcommand parsers too: they are built with this class): with
    them on, Slurm's `--gpus 8` (8 GPUs in total) was read as `--gpus-per-node 8`, and `--cpus`
    as `--cpus-per-task`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.fail(message, f"`{self.prog} --help` lists the options")

    def fail(self, message: str, hint: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {render(f'{message}.', f'{hint}.')}\n")


def build_parser(commands: Sequence[str] = COMMANDS) -> _Parser:
    """The parser of `torchslurm`, with the subcommands in `commands` (all of them by default)."""
    parser = _Parser(
        prog="torchslurm",
        description="Distributed PyTorch training on SLURM clusters that just works.",
    )
    parser.add_argument("--version", action="version", version=f"torchslurm {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in commands:
        importlib.import_module(f"torchslurm.cli.{name}").register(subparsers)
    return parser


def commands_needed(argv: Sequence[str]) -> tuple[str, ...]:
    """The subcommands whose modules a command line needs: only the one it names when nothing but
    -v comes before it (its parser and its help are the same either way), else all of them (the
    top-level help and errors list them). Importing every subcommand's module (the trainer's settings,
    job specs, the sandbox) costs `torchslurm run` about 0.1 s before its ranks start."""
    for arg in argv:
        if arg in COMMANDS:
            return (arg,)
        if arg not in ("-v", "--verbose"):
            break
    return COMMANDS


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return actions[0].choices[command]  # type: ignore[no-any-return]


def _settings_anywhere(args: argparse.Namespace, extra: list[str]) -> list[str]:
    """A subcommand that takes `key=value` settings (its `overrides` positional) takes them anywhere on
    the line: argparse gives those after an option (`train dataset=text --nproc 2 epochs=4`) back as
    unknown, and they join the others in order. What is left over is unknown."""
    if not isinstance(getattr(args, "overrides", None), list):
        return extra
    settings = [arg for arg in extra if "=" in arg and not arg.startswith("-")]
    args.overrides += settings
    return [arg for arg in extra if arg not in settings]


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
    """`torchslurm ARGS…` (sys.argv without `argv`); returns the exit code. Without `argv` (the program
    itself) it ends the process with that code (cli.ending)."""
    parser = build_parser(commands_needed(sys.argv[1:] if argv is None else argv))
    args, extra = parser.parse_known_args(argv)
    extra = _settings_anywhere(args, extra)
    if extra:  # named here, with the subcommand: argparse would blame the top-level parser
        from torchslurm.jobs.flags import slurm_flag_advice, torchrun_flag_advice

        parser.prog = f"torchslurm {args.command}" if args.command else "torchslurm"
        accepted = _subparser(parser, args.command)._option_string_actions if args.command else {}
        flags = [arg for arg in extra if arg.startswith("-")]
        advice = [a for arg in flags for a in (slurm_flag_advice(arg, accepted), torchrun_flag_advice(arg, accepted))
                  if a]
        if advice:
            parser.fail("; ".join(dict.fromkeys(what for what, _ in advice)),
                        "; ".join(dict.fromkeys(hint for _, hint in advice)))
        guesses = [f"{flag} -> {close[0]}" for flag in flags
                   if (close := difflib.get_close_matches(flag.split("=", 1)[0], list(accepted), n=1, cutoff=0.8))]
        did_you_mean = f"did you mean {', '.join(guesses)}? " if guesses else ""
        parser.fail(f"unrecognized arguments: {' '.join(extra)}",
                    f"{did_you_mean}`{parser.prog} --help` lists the options")
    if args.command is None:
        parser.print_help()
        return 2
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for hints that quote the command
    setup_logging(args.verbose)
    code = _handle(args)
    if argv is None:  # the program itself, not a call from Python
        exit_process(code)
    return code


def _handle(args: argparse.Namespace) -> int:
    try:
        return int(args.handler(args))
    except TorchSlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
