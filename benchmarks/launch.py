"""How long `torchslurm run` takes against torchrun, for a script that initialises, takes one
DDP step on a tiny model and exits (benchmarks/_peer_workers/one_step.py, torchslurm.init() under both):

    torchslurm run --nproc 2 one_step.py
    python -m torch.distributed.run --standalone --nproc-per-node 2 one_step.py

Wall time of the whole command, in interleaved pairs whose order alternates (A B, B A, ...), so
drift in machine load hits both alike; after --warmup untimed pairs, the median of --rounds
pairs and the ratio of the medians (goal: at most 1.03). Side figure: `torchslurm --help` against
`python -c pass`, interleaved the same way. A benchmark: it reports, asserts nothing.

The timed commands run with Python's bytecode cache: PYTHONDONTWRITEBYTECODE is taken out of their
environment, so the warm-up writes torchslurm's .pyc files as installing it does (torch's came with its
wheel). With it set, every start compiles torchslurm's modules again, in the launcher and in each rank
(about 0.1 s of the launcher's on a busy 2-core machine); --as-set keeps the environment as it is.

    python benchmarks/launch.py [--rounds 5] [--warmup 1] [--nproc 2] [--as-set]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from peers import worker_stderr  # benchmarks/peers.py, beside this script

SCRIPT = Path(__file__).resolve().parent / "_peer_workers" / "one_step.py"
GOAL_RATIO = 1.03
"""`torchslurm run` should take at most this much longer than torchrun."""


class CommandFailed(Exception):
    """A timed command exited non-zero."""


def torchslurm_command() -> list[str]:
    """The `torchslurm` console script of this interpreter's environment (what a user types)."""
    beside = Path(sys.executable).parent / "torchslurm"
    found = str(beside) if beside.is_file() else shutil.which("torchslurm")
    if found is None:
        raise CommandFailed(f"no `torchslurm` command beside {sys.executable} or on PATH. "
                            "HINT: pip install -e . in this environment, or activate it.")
    return [found]


def timed_environ(environ: dict[str, str], as_set: bool) -> dict[str, str]:
    """The timed commands' environment: `environ`, without PYTHONDONTWRITEBYTECODE unless `as_set`."""
    return dict(environ) if as_set else {k: v for k, v in environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def time_once(command: list[str], timeout: float, tail: int, environ: dict[str, str] | None = None) -> float:
    """Seconds from start to exit of `command`; CommandFailed (with its output's tail) if it fails."""
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environ)
    except subprocess.TimeoutExpired as exc:
        raise CommandFailed(f"`{' '.join(command)}` ran past --timeout {timeout} s") from exc
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise CommandFailed(f"`{' '.join(command)}` exited {done.returncode}\n"
                            f"{worker_stderr(done.stderr or done.stdout, tail)}")
    return elapsed


def interleaved(a: list[str], b: list[str], args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Timed pairs of `a` and `b`, alternating which goes first; the warm-up pairs are dropped."""
    times_a, times_b = [], []
    for i in range(args.warmup + args.rounds):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        t_first = time_once(first, args.timeout, args.tail, args.environ)
        t_second = time_once(second, args.timeout, args.tail, args.environ)
        t_a, t_b = (t_first, t_second) if first is a else (t_second, t_first)
        if i >= args.warmup:
            times_a.append(t_a)
            times_b.append(t_b)
            print(f"  pair {i - args.warmup + 1}/{args.rounds}: {t_a:7.3f} s vs {t_b:7.3f} s", flush=True)
    return times_a, times_b


def report(name_a: str, name_b: str, times_a: list[float], times_b: list[float]) -> float:
    """Print medians, bests and ratios; return the ratio of the medians."""
    med_a, med_b = statistics.median(times_a), statistics.median(times_b)
    paired = statistics.median(x / y for x, y in zip(times_a, times_b, strict=True))
    width = max(len(name_a), len(name_b))
    print(f"  {'command':{width}s} {'median s':>9s} {'best s':>8s}")
    print(f"  {name_a:{width}s} {med_a:9.3f} {min(times_a):8.3f}")
    print(f"  {name_b:{width}s} {med_b:9.3f} {min(times_b):8.3f}")
    print(f"  ratio of medians {med_a / med_b:.3f} (median of paired ratios {paired:.3f}); "
          f"difference {1000 * (med_a - med_b):+.0f} ms")
    return med_a / med_b


def machine_line() -> str:
    import torch  # only for its version: the timed commands import it themselves

    cpu = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                    if line.startswith("model name")), cpu)
    return (f"machine: {cpu}, {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), torch "
            f"{torch.__version__}, python {platform.python_version()}, "
            f"{datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="timed pairs of each comparison (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed pairs first (default 1)")
    parser.add_argument("--nproc", type=int, default=2, help="local ranks per launch (default 2)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one command may take (default 300)")
    parser.add_argument("--tail", type=int, default=30, help="lines of a failed command's output to show")
    parser.add_argument("--as-set", action="store_true",
                        help="keep PYTHONDONTWRITEBYTECODE if set (every start compiles torchslurm's modules)")
    args = parser.parse_args(argv)
    args.environ = timed_environ(dict(os.environ), args.as_set)
    if args.rounds < 1 or args.warmup < 0 or args.nproc < 1:
        parser.error("expected --rounds >= 1, --warmup >= 0 and --nproc >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cli = torchslurm_command()
        ours = [*cli, "run", "--nproc", str(args.nproc), str(SCRIPT)]
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                    str(args.nproc), str(SCRIPT)]
        print(f"launch: {args.nproc} local ranks, init + one DDP step ({SCRIPT.name}), {args.rounds} pairs after "
              f"{args.warmup} warm-up\n{machine_line()}")
        cache = "off (PYTHONDONTWRITEBYTECODE, --as-set)" if "PYTHONDONTWRITEBYTECODE" in args.environ else "on"
        print(f"bytecode cache: {cache}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"\n{' '.join(ours)}\n  vs {' '.join(torchrun)}")
        launch = report("torchslurm run", "torchrun", *interleaved(ours, torchrun, args))
        print(f"  goal: ratio <= {GOAL_RATIO}: {'met' if launch <= GOAL_RATIO else 'NOT met'}")
        print(f"\nside figure: {' '.join(cli)} --help vs {sys.executable} -c pass")
        report("torchslurm --help", "python -c pass", *interleaved([*cli, "--help"], [sys.executable, "-c", "pass"],
                                                                   args))
        print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    except CommandFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
