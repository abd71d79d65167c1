"""`torchslurm cancel JOB [--signal SIG]`: stop a job (scancel)."""

from __future__ import annotations

import argparse

from torchslurm.cli.sandbox import hint_sandbox
from torchslurm.errors import ConfigError, shown
from torchslurm.runtime.variables import is_digits

# The names scancel --signal knows (Slurm src/common/proc_args.c, signals_mapping), in its order;
# it also takes them with a SIG prefix, in any case, or as a number.
SCANCEL_SIGNALS = ("HUP", "INT", "QUIT", "ABRT", "KILL", "ALRM", "TERM", "USR1", "USR2", "URG", "CONT", "STOP",
                   "TSTP", "TTIN", "TTOU", "XCPU")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cancel", help="cancel a job, or send its ranks a signal",
        description="Cancel a job (scancel JOB), or with --signal send a signal to its tasks and keep it "
        "running: the ranks of a preemptible job take their spec's signal (USR2 by default) as the request "
        "to checkpoint and stop.")
    parser.add_argument("job", help="job id")
    parser.add_argument("--signal", default=None, metavar="SIG",
                        help="send SIG to the job's tasks instead of cancelling it: "
                        f"{', '.join(SCANCEL_SIGNALS)} (SIG prefix optional) or a number")
    parser.set_defaults(handler=hint_sandbox(handle))


def check_signal(text: str) -> str:
    """`text` as scancel will read it (`sigusr2` -> `USR2`); a ConfigError listing the names otherwise."""
    name = text.strip().upper().removeprefix("SIG")
    if name in SCANCEL_SIGNALS:
        return name
    if is_digits(name) and 1 <= int(name) <= 64:
        return str(int(name))
    raise ConfigError(f"--signal={shown(text)} is not a signal scancel knows.", "use one of "
                      f"{', '.join(SCANCEL_SIGNALS)} (SIG prefix optional) or a signal number; a preemptible "
                      "job checkpoints and stops on its spec's signal (USR2 by default).")


def handle(args: argparse.Namespace) -> int:
    from torchslurm.jobs.slurm import SlurmClient

    signal = None if args.signal is None else check_signal(args.signal)
    before = SlurmClient().cancel(args.job, signal=signal)  # a SlurmError for a job Slurm does not know
    if before is not None and before.finished:
        print(f"job {args.job} had already ended ({before.state}): nothing to {'signal' if signal else 'cancel'}")
        return 0
    print(f"job {args.job}: " + (f"sent {signal}" if signal else "cancel requested"))
    return 0
