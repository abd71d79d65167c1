"""`torchslurm cancel JOB [--signal SIG]`: stop a job (scancel)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("cancel", help="cancel a job, or send its ranks a signal")
    parser.add_argument("job", help="job id")
    parser.add_argument("--signal", default=None, metavar="SIG",
                        help="send SIG (e.g. USR2) to the job's tasks instead of cancelling it")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from torchslurm.slurm import SlurmClient

    SlurmClient().cancel(args.job, signal=args.signal)
    print(f"job {args.job}: " + (f"sent {args.signal}" if args.signal else "cancel requested"))
    return 0
