"""How long a `torchslurm` command takes to start, over a bare `python -c pass`.

The job commands run on login nodes, often many times in a row (a sweep, a shell loop over
`torchslurm status`), so their start-up is what the user waits for. Each command runs as a
subprocess of the same interpreter, interleaved round by round (so drift in machine load hits
every command alike); the table shows the median seconds and the overhead over `python -c pass`.
A second, untimed run of each command with `-X importtime` says whether torch was imported and
which imports cost the most. This is a benchmark: it reports, it asserts nothing.

    python benchmarks/cli_startup.py [--rounds 15] [--top 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 0.15
"""Overhead over `python -c pass` that a job command should stay under."""

LINT_SCRIPT = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
srun --kill-on-bad-exit=1 python train.py
"""


def commands(python: str) -> dict[str, list[str]]:
    cli = [python, "-m", "torchslurm"]
    return {
        "python -c pass": [python, "-c", "pass"],
        "torchslurm --help": [*cli, "--help"],
        "torchslurm lint job.sbatch": [*cli, "lint", "job.sbatch"],
        "torchslurm script --gpus-per-node 4 train.py": [*cli, "script", "--gpus-per-node", "4", "train.py"],
    }


def run_once(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def import_times(argv: list[str], cwd: Path, env: dict[str, str]) -> list[tuple[int, str]]:
    """(cumulative microseconds, module) of every import the command made, from `-X importtime`."""
    result = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], cwd=cwd, env=env, capture_output=True,
                            text=True, check=False)
    rows = []
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, module = line.removeprefix("import time:").split("|")
        rows.append((int(cumulative), module[1:].rstrip()))  # nested imports keep their indentation
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="runs of each command (median taken)")
    parser.add_argument("--top", type=int, default=8, help="slowest imports listed per command")
    args = parser.parse_args(argv)
    python = sys.executable
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPROFILEIMPORTTIME"}
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        (cwd / "train.py").write_text("print('training')\n")
        (cwd / "job.sbatch").write_text(LINT_SCRIPT)
        todo = commands(python)
        times: dict[str, list[float]] = {name: [] for name in todo}
        for command in todo.values():  # warm the file cache and the .pyc files first
            run_once(command, cwd, env)
        for _ in range(args.rounds):
            for name, command in todo.items():
                times[name].append(run_once(command, cwd, env))
        imports = {name: import_times(command, cwd, env) for name, command in todo.items()}

    base = statistics.median(times["python -c pass"])
    print(f"{python}, {args.rounds} rounds, median seconds (goal: <= {GOAL_S:.2f} s over python -c pass)\n")
    print(f"{'command':<48} {'median':>8} {'overhead':>9}  torch imported")
    for name, samples in times.items():
        median = statistics.median(samples)
        torch = any(module.strip() == "torch" for _, module in imports[name])
        within = "" if name == "python -c pass" else ("  ok" if median - base <= GOAL_S else "  over goal")
        print(f"{name:<48} {median:>8.3f} {median - base:>+9.3f}  {'yes' if torch else 'no'}{within}")
    for name, rows in imports.items():
        if name == "python -c pass":
            continue
        top = sorted(((us, module) for us, module in rows if not module.startswith(" ")), reverse=True)
        print(f"\nslowest top-level imports of `{name}` (cumulative ms):")
        for us, module in top[:args.top]:
            print(f"  {us / 1000:8.1f}  {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
