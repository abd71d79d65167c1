"""`torchslurm logs JOB [--rank R] [-f]`: print (or follow) a job's output."""

from __future__ import annotations

import argparse
import sys
import time

from torchslurm.cli.sandbox import hint_sandbox


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "logs", help="print a job's output, one rank's, or follow it",
        description="Print a job's output file (the path scontrol reports for it). --rank R keeps rank R's "
        "lines: its own file with per_rank_output, else the lines srun --label prefixed with `R: `. "
        "-f keeps printing new output until the job ends.")
    parser.add_argument("job", help="job id")
    parser.add_argument("--rank", type=int, default=None, metavar="R", help="only rank R's output")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    parser.add_argument("--poll-s", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.set_defaults(handler=hint_sandbox(handle))


def handle(args: argparse.Namespace) -> int:
    from torchslurm.errors import SlurmError
    from torchslurm.jobs.submit import Job

    job = Job(args.job)
    if not args.follow:
        sys.stdout.write(job.logs(args.rank))
        return 0
    shown = 0
    while True:
        done = job.status().finished  # read the state first, so the last lines are not missed
        try:
            text = job.logs(args.rank)
        except SlurmError:  # a pending job has no file yet; keep waiting
            text = ""
        sys.stdout.write(text[shown:])
        sys.stdout.flush()
        shown = len(text)
        if done:
            return 0
        time.sleep(args.poll_s)
