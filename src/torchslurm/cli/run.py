"""`torchslurm run [--nproc N] [-m] script.py [args…]`: start the ranks wherever we are."""

from __future__ import annotations

import argparse
import logging
import os
import sys

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a training script on N local ranks, across a Slurm allocation, or as one srun task",
        description="Here: N local ranks (default: one per GPU, else 2). In an sbatch/salloc shell: "
        "srun across every allocated node. Under srun/torchrun: run the script as this rank. "
        "The script gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT like under torchrun.",
    )
    parser.add_argument("--nproc", type=int, default=None, metavar="N",
                        help="ranks on this machine (per node inside an allocation)")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="K",
                        help="local runs: restart all ranks up to K times after a failure")
    parser.add_argument("--dry-run", action="store_true", help="print what would run and exit")
    parser.add_argument("-m", dest="module", action="store_true",
                        help="the script is a module name: each rank runs `python -m script`")
    parser.add_argument("script", help="the Python script to run (a module name with -m)")
    rest = parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    rest.required = False  # argparse counts a REMAINDER positional as required, and would say so when none is given
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from torchslurm.runtime import launch, runchecks

    # before anything starts, --dry-run too
    runchecks.check_run_options(args.script, args.nproc, args.max_restarts, module=args.module)
    plan = launch.plan(os.environ, args.script, args.args, args.nproc, sys.executable, launch.cuda_device_count(),
                       module=args.module)
    for flag in runchecks.run_flags_after_script(args.args) if plan.mode != "exec" else ():  # once, not per srun task
        logger.warning("%s comes after %s, so %s gets it, not torchslurm run; put it before the script "
                       "(torchslurm run %s ... %s) unless %s takes %s itself", flag, args.script, args.script, flag,
                       args.script, args.script, flag)
    if args.dry_run:
        print(f"{plan.mode}: {plan.reason}")
        print(" ".join(plan.argv))
        return 0
    logger.info("%s", plan.reason)
    return launch.execute(plan, os.environ, max_restarts=args.max_restarts)
