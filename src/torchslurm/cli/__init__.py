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
from collections.abc import Collection, Sequence
from typing import Any, NoReturn

from torchslurm._version import __version__
from torchslurm.errors import TorchSlurmError, render

# Subcommand modules, in the order `--help` lists them.
COMMANDS: tuple[str, ...] = ("run", "train", "sandbox", "script", "submit", "status", "logs", "cancel", "lint",
                             "doctor", "bench")


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


# sbatch's own spelling (sbatch(1)) of what the job spec asks in another way: flag -> (torchslurm
# flag, what the sbatch flag means, how to say it in torchslurm).
_PER_NODE_GPUS = ("--gpus-per-node", "is Slurm's GPU count for the whole job; torchslurm asks per node",
                  "use --gpus-per-node N (the job gets --nodes x N GPUs), e.g. --nodes 2 --gpus-per-node 4 "
                  "for 8 GPUs")
_PER_NODE_TASKS = ("--tasks-per-node", "is Slurm's task count for the whole job; torchslurm asks per node",
                   "use --tasks-per-node N (the job gets --nodes x N tasks); in srun mode it defaults to "
                   "--gpus-per-node, one task per GPU")
_NAME = ("--name", "is spelled --name in torchslurm (rendered as #SBATCH --job-name)", "use --name NAME")
SLURM_EQUIVALENTS: dict[str, tuple[str, str, str]] = {
    "--gpus": _PER_NODE_GPUS, "-G": _PER_NODE_GPUS,
    "--gpus-per-task": ("--gpus-per-node", "is not a job spec field; srun mode runs one task per GPU",
                        "use --gpus-per-node N (tasks per node follow it)"),
    "--gres": ("--gpus-per-node", "is not a job spec field; torchslurm asks GPUs per node",
               "use --gpus-per-node N, and --gpu-flag gres to have it rendered as --gres=gpu:N"),
    "--ntasks": _PER_NODE_TASKS, "-n": _PER_NODE_TASKS,
    "--ntasks-per-node": ("--tasks-per-node", "is spelled --tasks-per-node in torchslurm",
                          "use --tasks-per-node N"),
    "--job-name": _NAME, "-J": _NAME,
    "--cpus": ("--cpus-per-task", "is not a Slurm or torchslurm flag; CPUs are asked per task",
               "use --cpus-per-task N"),
    "--cpus-per-gpu": ("--cpus-per-task", "is not a job spec field; srun mode runs one task per GPU",
                       "use --cpus-per-task N (in torchrun mode: N x the workers per node)"),
    "--mem-per-gpu": ("--mem", "is not a job spec field; torchslurm asks memory per node",
                      "use --mem SIZE per node, e.g. --mem 320G for 8 GPUs x 40G"),
    "--mem-per-cpu": ("--mem", "is not a job spec field; torchslurm asks memory per node",
                      "use --mem SIZE per node (memory per CPU x the CPUs of the node's tasks)"),
    "--export": ("--env", "is not a job spec field; torchslurm exports variables one by one",
                 "use --env NAME=VALUE (repeatable)"),
    "--nproc": ("--nproc-per-node", "is spelled --nproc-per-node in job specs (torchrun mode)",
                "use --nproc-per-node N with --launch torchrun"),
    **{short: (long, f"is sbatch's short form of {long}", f"use {long}") for short, long in (
        ("-N", "--nodes"), ("-c", "--cpus-per-task"), ("-t", "--time"), ("-p", "--partition"),
        ("-A", "--account"), ("-q", "--qos"), ("-C", "--constraint"), ("-w", "--nodelist"),
        ("-x", "--exclude"), ("-o", "--output"), ("-e", "--error"), ("-a", "--array"))},
}
# sbatch options with no job spec field (and the spec has no field for raw sbatch options)
SBATCH_ONLY = frozenset({
    "--chdir", "-D", "--mail-type", "--mail-user", "--reservation", "--exclusive", "--dependency", "-d",
    "--begin", "-b", "--licenses", "-L", "--gpu-bind", "--cpu-bind", "--mem-bind", "--hint", "--tmp",
    "--comment", "--nice", "--wckey", "--time-min", "--distribution", "-m", "--switches", "--container",
    "--open-mode", "--mincpus", "--sockets-per-node", "--cores-per-socket", "--threads-per-core",
    "--ntasks-per-core", "--ntasks-per-socket", "--oversubscribe", "-s", "--hold", "-H", "--priority",
    "--get-user-env", "--propagate", "--clusters", "-M", "--gpu-freq", "--cpu-freq", "--network",
    "--deadline", "--kill-on-invalid-dep", "--acctg-freq", "--core-spec", "-S", "--tres-per-task",
    "--ntasks-per-gpu", "--spread-job", "--use-min-nodes", "--wait", "-W", "--test-only",
})


def _flag_name(arg: str) -> str:
    """`--gpus=8` -> `--gpus`, `-n4` -> `-n`."""
    return arg.split("=", 1)[0] if arg.startswith("--") else arg[:2]


def slurm_flag_advice(arg: str, accepted: Collection[str]) -> tuple[str, str] | None:
    """(what is wrong, the fix) for an sbatch flag that a subcommand taking `accepted` flags refused."""
    flag = _flag_name(arg)
    if flag in SLURM_EQUIVALENTS and SLURM_EQUIVALENTS[flag][0] in accepted:
        _, meaning, hint = SLURM_EQUIVALENTS[flag]
        return f"{flag} {meaning}", hint
    if flag in SBATCH_ONLY and "--partition" in accepted:
        return (f"{flag} is an sbatch option that the job spec has no field for (nor one for raw sbatch options)",
                f"render the script (`torchslurm script ... > job.sbatch`), then `sbatch {flag}=... job.sbatch` "
                f"(sbatch's own options win over the script's #SBATCH lines)")
    return None


def build_parser() -> _Parser:
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


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return actions[0].choices[command]  # type: ignore[no-any-return]


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
        accepted = _subparser(parser, args.command)._option_string_actions if args.command else {}
        advice = [a for a in (slurm_flag_advice(arg, accepted) for arg in extra if arg.startswith("-")) if a]
        if advice:
            parser.fail("; ".join(dict.fromkeys(what for what, _ in advice)),
                        "; ".join(dict.fromkeys(hint for _, hint in advice)))
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return 2
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for hints that quote the command
    setup_logging(args.verbose)
    try:
        return int(args.handler(args))
    except TorchSlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
