"""`torchslurm bench [--nproc N] [--sizes 1K,1M] [--iters N] [--backend B] [--json FILE]`.

Collective bus bandwidth (nccl-tests' formulas) between the ranks, started the way
`torchslurm run` starts them: N local ranks here, srun across every node in a batch shell, or
this process as one rank under srun/torchrun. Rank 0 prints the table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from torchslurm.cli.ending import exit_process
from torchslurm.doctor.bench import DEFAULT_SIZES, OPS, BenchConfig, parse_sizes
from torchslurm.errors import ConfigError, TorchSlurmError

logger = logging.getLogger(__name__)

RANK_PROGRAM = "torchslurm.cli.bench"
"""What each rank runs: `python -m RANK_PROGRAM` (this module's `rank_main`)."""


def _add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=DEFAULT_SIZES, metavar="LIST",
                        help=f"message sizes, K/M/G = 1024-based (default {DEFAULT_SIZES})")
    parser.add_argument("--ops", default=",".join(OPS), metavar="LIST",
                        help=f"collectives to time (default {','.join(OPS)})")
    parser.add_argument("--iters", type=int, default=20, metavar="N", help="timed iterations per size (default 20)")
    parser.add_argument("--warmup", type=int, default=5, metavar="N", help="untimed iterations first (default 5)")
    parser.add_argument("--backend", default=None, metavar="B",
                        help="gloo or nccl (default: NCCL with GPUs, else Gloo)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="rank 0 also writes the results here")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bench", help="measure all_reduce/all_gather/broadcast bus bandwidth between the ranks",
        description="Time collectives over message sizes and print nccl-tests-style algbw/busbw. "
        "Here: N local ranks (--nproc, default one per GPU, else 2). In an sbatch/salloc shell: srun "
        "across every allocated node. Under srun/torchrun: this process is one rank.",
    )
    parser.add_argument("--nproc", type=int, default=None, metavar="N",
                        help="ranks on this machine (per node inside an allocation)")
    parser.add_argument("--dry-run", action="store_true", help="print what would run and exit")
    _add_bench_arguments(parser)
    parser.set_defaults(handler=handle)


def config_from(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(ops=tuple(op.strip() for op in args.ops.split(",") if op.strip()),
                       sizes=parse_sizes(args.sizes), iters=args.iters, warmup=args.warmup, backend=args.backend)


def handle(args: argparse.Namespace) -> int:
    from torchslurm.runtime import launch

    config_from(args)  # fail here, not in N ranks
    if args.json is not None:
        ConfigError.raise_any([json_path_problem(args.json)])  # not after the whole benchmark ran
    rank_args = ["--sizes", args.sizes, "--ops", args.ops, "--iters", str(args.iters), "--warmup", str(args.warmup),
                 *(["--backend", args.backend] if args.backend else []),
                 *(["--json", str(args.json.resolve())] if args.json else [])]
    plan = launch.plan(os.environ, RANK_PROGRAM, rank_args, args.nproc, sys.executable, launch.cuda_device_count(),
                       module=True)
    if args.dry_run:
        print(f"{plan.mode}: {plan.reason}")
        print(" ".join(plan.argv))
        return 0
    logger.info("%s", plan.reason)
    return launch.execute(plan, os.environ)


JSON_HINT = "give a file in an existing folder you can write to, e.g. --json bench.json."


def json_path_problem(path: Path) -> ConfigError | None:
    """Why rank 0 could not write --json `path` (its folder missing or read-only, or a folder itself), or None."""
    folder = path.resolve().parent
    if path.is_dir():
        return ConfigError(f"--json {path} is a directory; expected a file to write the results to.", JSON_HINT)
    if not folder.is_dir():
        return ConfigError(f"--json {path}: the folder {folder} does not exist; expected a file in an existing "
                           "folder.", JSON_HINT)
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return ConfigError(f"--json {path}: {path if path.exists() else folder} is not writable.", JSON_HINT)
    return None


def _write_json(path: Path, text: str) -> int:
    """Write the results; when that fails, print them (they took a while to measure) and the error."""
    try:
        path.write_text(text)
    except OSError as exc:
        sys.stdout.write(text)
        sys.stdout.flush()
        error = TorchSlurmError(f"--json {path}: cannot write the results ({exc.strerror or exc}); they are "
                                "printed above as JSON instead.", JSON_HINT)
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def rank_main(argv: Sequence[str] | None = None) -> int:
    """The program of each rank: init, time the collectives, rank 0 prints the table."""
    import torchslurm
    from torchslurm.doctor import bench

    parser = argparse.ArgumentParser(prog="torchslurm bench (rank)")
    _add_bench_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from(args)
        with torchslurm.init(backend=config.backend) as ctx:
            results = bench.run(config, ctx)
            if ctx.is_main:
                header = (f"torchslurm bench: {ctx.world_size} rank(s) on {ctx.env.num_nodes} node(s), "
                          f"{ctx.backend} on {ctx.device}, {config.iters} iterations (+{config.warmup} warm-up)")
                sys.stdout.write(bench.render_table(results, header))
                sys.stdout.flush()
                if args.json:
                    return _write_json(args.json, json.dumps(bench.to_json(results, ctx), indent=1) + "\n")
    except TorchSlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # a rank started by `torchslurm bench`: python -m torchslurm.cli.bench
    exit_process(rank_main())
