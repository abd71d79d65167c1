"""`torchslurm stacks JOB` / `--run-dir DIR`: where every rank of a running job is, grouped."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from torchslurm.errors import ConfigError

WAIT_S = 8.0
"""How long the ranks get to answer (each looks once per runtime.stackwatch.POLL_S)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "stacks", help="show where every rank of a running job is (grouped Python stacks)",
        description="Ask every rank of a running job for its Python stacks (all threads) and print them grouped: "
        "which ranks are where, the user's file:line first, the odd group and mismatched collectives named. "
        "The ranks answer from a thread of their own, through files in the job's folder "
        "(~/.torchslurm/jobs/JOB, written by torchslurm.init()) or in a run_dir: training goes on. See "
        "docs/hangs.md.")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("job", nargs="?", help="Slurm job id (its ranks called torchslurm.init())")
    where.add_argument("--run-dir", type=Path,
                       help="the run's run_dir (the Trainer's, or torchslurm.init(run_dir=...))")
    parser.add_argument("--wait", type=float, default=WAIT_S, metavar="S",
                        help=f"seconds to wait for the ranks' answers (default {WAIT_S:g})")
    parser.add_argument("--json", action="store_true", help="every rank's full stacks as JSON instead")
    parser.set_defaults(handler=handle)


def folder_of(job: str | None, run_dir: Path | None, home: Path) -> Path:
    """The folder the ranks watch, or a ConfigError saying why there is none."""
    from torchslurm.jobs.slurmoutput import check_job_id
    from torchslurm.runtime.stackwatch import job_dir, watching

    # a job id names a folder under ~/.torchslurm/jobs: never one outside it (`../..`)
    folder = run_dir if run_dir is not None else job_dir(check_job_id(str(job)), home)
    if watching([folder]):
        return folder
    if run_dir is not None:
        raise ConfigError(
            f"--run-dir {run_dir}: no rank watches it (no {folder / '.torchslurm-stacks' / 'request'}).",
            "pass the run_dir of a running Trainer, or of torchslurm.init(run_dir=...); `torchslurm stacks JOB` "
            "finds a Slurm job's ranks without it")
    raise ConfigError(
        f"no rank of job {job} is registered in {folder}: the job is not running, has not reached "
        "torchslurm.init() yet, or its nodes do not share this home folder.",
        "check `torchslurm status JOB`; or use `torchslurm stacks --run-dir DIR` with a run_dir on a shared file "
        "system")


def handle(args: argparse.Namespace) -> int:
    from torchslurm.runtime.stackreport import format_groups
    from torchslurm.runtime.stackwatch import collect, registered

    if args.wait <= 0:
        raise ConfigError(f"--wait {args.wait:g}: expected a positive number of seconds.", "e.g. --wait 8")
    folder = folder_of(args.job, args.run_dir, Path.home())
    started = time.monotonic()
    stacks, world = collect(folder, args.wait)
    took = time.monotonic() - started
    if args.json:
        print(json.dumps({str(r): json.loads(s.to_json()) for r, s in sorted(stacks.items())}, indent=1))
        return 0 if stacks else 1
    if not stacks:
        known = registered(folder)
        who = ", ".join(f"rank {r} (pid {d.get('pid')} on {d.get('host')})" for r, d in sorted(known.items())[:8])
        print(f"no rank answered within {args.wait:g} s in {folder}; registered: {who or 'none'}. Ranks that "
              "crashed leave their files behind; a rank whose C code holds the GIL cannot answer.")
        return 1
    name = f"job {args.job}" if args.job else str(folder)
    print(f"{name}: {len(stacks)} of {world} rank(s) answered in {took:.1f} s; main threads, innermost call first:")
    print(format_groups(stacks, world, distributed=world > 1))
    return 0
