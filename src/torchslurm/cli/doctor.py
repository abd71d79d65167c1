"""`torchslurm doctor [--json] [--connect] [--ranks | --nproc N]`: find the fault before a job hangs.

Plain `torchslurm doctor` checks this process: on a login node, in a batch shell, or as every
task with `srun torchslurm doctor`. `--ranks` (implied by `--nproc N`) starts the checks in every rank the way
`torchslurm run` would (N local ranks here, srun across all nodes in a batch shell), and with
`--connect` the ranks really form a process group. Exit code 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from torchslurm.cli.ending import exit_process

if TYPE_CHECKING:
    from torchslurm.doctor.facts import Report

logger = logging.getLogger(__name__)

ABOVE = "the lines above say why."
RANK_PROGRAM = "torchslurm.cli.doctor"
"""What each rank of `--ranks` runs: `python -m RANK_PROGRAM` (this module's `rank_main`)."""


def _add_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object per process instead of text")
    parser.add_argument("--connect", action="store_true",
                        help="really join the process group (short timeout) and time one all_reduce")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="--connect: seconds to wait for the other ranks (default 30)")
    from torchslurm.runtime.devices import BACKENDS

    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="the backend you intend to use (default: NCCL with GPUs, else Gloo)")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check placement, GPUs, network interface, master address and port; find the fault",
        description="Check what torchslurm.init() would do here and what would break: placement "
        "(srun or not), GPUs per rank, the network interface and why, MASTER_ADDR/MASTER_PORT, "
        "*_SOCKET_IFNAME, backend, torch/CUDA/NCCL versions, Slurm commands. "
        "Run it on a login node, in a batch shell, or as every task: srun torchslurm doctor.",
    )
    _add_check_arguments(parser)
    parser.add_argument("--ranks", action="store_true",
                        help="run the checks in every rank, started like `torchslurm run` does "
                        "(local ranks here; srun across all nodes in a batch shell)")
    parser.add_argument("--nproc", type=int, default=None, metavar="N",
                        help="ranks on this machine (per node in an allocation); implies --ranks")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from torchslurm.runtime import distenv

    check_options(args)  # one error per mistake, before any rank starts
    # --nproc implies --ranks: asking for N ranks means wanting the checks in N ranks (as `run --nproc` does).
    wants_ranks = args.ranks or args.nproc is not None
    launcher = distenv.detect(os.environ, free_port=lambda: 0).launcher if wants_ranks else None
    if launcher not in ("local", "batch"):  # already a rank (or --ranks not asked for): check here
        return check_here(args)
    return check_ranks(args)


def check_options(args: argparse.Namespace) -> None:
    """--timeout and --nproc, checked here: a rank would get them wrong only after its start-up."""
    from torchslurm.errors import ConfigError
    from torchslurm.runtime.runchecks import nproc_problem

    ConfigError.raise_any([
        None if math.isfinite(args.timeout) and args.timeout > 0 else ConfigError(
            f"--timeout={args.timeout:g} must be a positive number of seconds.",
            "--timeout 30 (the default) waits up to 30 s for the other ranks."),
        nproc_problem(args.nproc),
    ])


def check_ranks(args: argparse.Namespace) -> int:
    """Run the checks in every rank through `torchslurm run`, then print the reports in rank order.

    The ranks exit 0 once they have reported, and the verdict is made here: under torchrun or
    `srun --kill-on-bad-exit` a rank that exits 1 gets the others killed before they print.
    """
    from torchslurm.doctor.checks import missing_ranks
    from torchslurm.doctor.facts import render
    from torchslurm.errors import TorchSlurmError

    rank_args = [*(["--connect"] if args.connect else []), "--timeout", str(args.timeout),
                 *(["--backend", args.backend] if args.backend else [])]
    nproc = ["--nproc", str(args.nproc)] if args.nproc is not None else []
    reports, unreadable, exit_code = _collect([sys.executable, "-m", "torchslurm", "run", *nproc,
                                               "-m", RANK_PROGRAM, *rank_args])
    if not reports:
        error = TorchSlurmError(f"no rank reported (torchslurm run exited with code {exit_code}).", "the lines "
                                "above say why; `torchslurm doctor` without --ranks checks this process alone.")
        print(f"error: {error}", file=sys.stderr)
        return exit_code or 1
    for result in reports:
        sys.stdout.write(json.dumps(result.to_json()) + "\n" if args.json else render(result))
    problems = []
    if missing := missing_ranks(reports):
        world = max(r.world_size or 1 for r in reports)  # known: missing_ranks needs a world size
        problems.append(TorchSlurmError(f"rank(s) {', '.join(map(str, missing))} of {world} did not report "
                                        f"(torchslurm run exited with code {exit_code}).", ABOVE))
    if unreadable:
        problems.append(TorchSlurmError(f"{unreadable} report(s) arrived cut or mixed up.", "run it again; or give "
                                        "each task its own file: srun --output=doctor-%t.json torchslurm doctor "
                                        "--json."))
    if any(result.failed for result in reports):
        problems.append(TorchSlurmError("the doctor found a failure in at least one rank (see its report above).",
                                        "fix what the FAIL lines name (each has its own HINT), then run it again."))
    if exit_code and not problems:
        problems.append(TorchSlurmError(f"every rank reported, but torchslurm run exited with code {exit_code}.",
                                        ABOVE))
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _collect(command: Sequence[str]) -> tuple[list[Report], int, int]:
    """Run the ranks; keep their reports, pass every other line through; (reports, unreadable, exit code)."""
    from torchslurm.doctor.wire import PART_TAG, reports_from_parts

    part_lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, encoding="utf-8",
                          errors="replace") as ranks:
        assert ranks.stdout is not None
        for line in ranks.stdout:
            if PART_TAG in line:
                part_lines.append(line)
            else:
                sys.stdout.write(line)
    return (*reports_from_parts(part_lines), ranks.returncode)


def check_here(args: argparse.Namespace) -> int:
    """Gather this process's facts, run every check, print the report."""
    from torchslurm.doctor.facts import render

    result = examine(args)
    text = json.dumps(result.to_json()) + "\n" if args.json else render(result)
    sys.stdout.write(text)  # one write: the ranks of one step share a pipe
    sys.stdout.flush()
    return 1 if result.failed else 0


def examine(args: argparse.Namespace) -> Report:
    from torchslurm.doctor import checks as doctor
    from torchslurm.doctor import probe

    facts = probe.gather(os.environ)
    checks = doctor.run_checks(facts, args.backend)
    if args.connect:
        checks.append(probe.check_connect(os.environ, args.backend, args.timeout))
    return doctor.report(facts, checks)


def rank_main(argv: Sequence[str] | None = None) -> int:
    """The program of each rank started by `torchslurm doctor --ranks`."""
    from torchslurm.doctor.wire import report_parts

    parser = argparse.ArgumentParser(prog="torchslurm doctor (rank)")
    _add_check_arguments(parser)
    for line in report_parts(examine(parser.parse_args(argv)), f"{socket.gethostname()}:{os.getpid()}"):
        os.write(sys.stdout.fileno(), line.encode())  # one write per part: atomic on a shared pipe
    return 0  # the verdict is check_ranks' (see there)


if __name__ == "__main__":  # a rank started by `torchslurm doctor --ranks`: python -m torchslurm.cli.doctor
    exit_process(rank_main())
