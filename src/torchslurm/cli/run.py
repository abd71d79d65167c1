"""`torchslurm run [--nproc N] script.py [args…]`: start the ranks wherever we are."""

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
    parser.add_argument("script", help="the Python script to run")
    rest = parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    rest.required = False  # argparse counts a REMAINDER positional as required, and would say so when none is given
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from torchslurm.runtime import launch

    launch.check_run_options(args.script, args.nproc, args.max_restarts)  # before anything starts, --dry-run too
    plan = launch.plan(os.environ, args.script, args.args, args.nproc, sys.executable, _cuda_device_count())
    if args.dry_run:
        print(f"{plan.mode}: {plan.reason}")
        print(" ".join(plan.argv))
        return 0
    logger.info("%s", plan.reason)
    return launch.execute(plan, os.environ, max_restarts=args.max_restarts)


def _cuda_device_count() -> int:
    """Visible GPUs, without importing torch when CUDA cannot be there."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1") or not os.path.exists("/dev/nvidiactl"):
        return 0
    import torch

    return int(torch.cuda.device_count())
