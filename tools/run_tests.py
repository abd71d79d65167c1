"""The test suite as `make test` runs it: two pytest processes side by side, in two rounds.

    python tools/run_tests.py            what `make test` runs
    python tools/run_tests.py --serial   one plain `pytest` over everything, one test after another, then mypy

Why side by side: a cluster test spends much of its time waiting for Slurm (scheduling, a job's start,
a time limit, a requeue) while the multiproc, docs and unit tests mostly compute; one after the other,
each leaves the 2-core CI machine partly idle. They share nothing else: only the cluster tests use the
sandbox (its own network namespaces and Slurm), the others loopback and their own temporary folders.

    round 1:  tests/cluster (but -m alone)   beside   tests/multiproc tests/docs
              + the GPU check's CPU form                  (but the GPU check)
    round 2:  tests/cluster -m alone         beside   tests/unit, then mypy

A cluster test marked `alone` needs its runs to start within a fixed part of a one-minute Slurm time
limit: it runs beside the unit tests only (one process, one core), never beside ranks that train.
The GPU check's CPU form (`make gpu-check`'s reduced form: one rank's start-ups) runs in the cluster
half. Round 2's cluster half (one test, 4 min) is longer than the unit tests (3 min): mypy (1 min, one
core, no ranks) runs after them there instead of before everything. A fresh clone's `bash .ci/run` on
the 2-core VM, 2026-11-27: 32.5-33.7 min (setup 2.6-3.3; round 1: the cluster half 25-27 min, 5.4 of it the
GPU check, beside 23.7-26; round 2: 3.7-4 beside unit + mypy); it was 39 min before these two moves.
2026-11-28, after every torchslurm program and rank program ends without the interpreter's teardown
(cli.ending): 32.0 and 28.5 min (round 1: 24.6 beside 23.8; 22.2 beside 21.3).
2026-11-28 on a faster 2-core VM (AMD EPYC Zen 4): 20.0 min (setup 2.5; tests 17.5); round 1 uses 88 % of
both cores (sampled every 5 s): the suite is CPU-bound, not waiting on Slurm.

Before either round, torchslurm's and the tests' modules are compiled to bytecode once, as a wheel's
install does (an editable install does not): where PYTHONDONTWRITEBYTECODE is set, as on this project's machines,
every process would compile the 70 modules a rank imports again (0.2 s each time, in hundreds of ranks);
Python still reads .pyc files it does not write.

The cluster tests' output goes to a log file, shown whole once they finish; the others' streams to the
terminal. The exit status is non-zero when any run failed.
"""

from __future__ import annotations

import argparse
import compileall
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST = [sys.executable, "-m", "pytest", "--durations=30"]  # the slowest tests of each run, for CI's time budget
MYPY = Path(sys.executable).parent / "mypy"
NO_TESTS = 5  # pytest's exit status when nothing was collected/selected


def passed(status: int) -> bool:
    return status in (0, NO_TESTS)


GPU_CHECK = "tests/docs/test_gpu_check.py"


def side_by_side(cluster_args: list[str], lane: list[list[str]], log: Path) -> tuple[int, list[int]]:
    """`pytest tests/cluster ...` (output to `log`, then shown) beside the commands of `lane`, one after
    the other (to the terminal); the exit status of each."""
    with log.open("w") as out:
        cluster = subprocess.Popen([*PYTEST, "tests/cluster", *cluster_args, "-p", "no:cacheprovider"], cwd=ROOT,
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        statuses = []
        try:
            for command in lane:
                print(f"\n$ {' '.join(command)}", flush=True)
                statuses.append(subprocess.call(command, cwd=ROOT))
        finally:
            cluster_status = cluster.wait()
    print(f"\n===== beside them: pytest tests/cluster {' '.join(cluster_args)} (exit {cluster_status}) =====",
          flush=True)
    sys.stdout.write(log.read_text(errors="replace"))
    return cluster_status, statuses


def compile_sources() -> None:
    for folder in ("src", "tests", "benchmarks"):
        compileall.compile_dir(ROOT / folder, quiet=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serial", action="store_true", help="one plain pytest run over everything")
    args = parser.parse_args(argv)
    compile_sources()
    if args.serial:
        return subprocess.call(PYTEST, cwd=ROOT) or subprocess.call([str(MYPY)], cwd=ROOT)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torchslurm-tests-") as tmp:
        log = Path(tmp) / "cluster-tests.log"
        print(f"round 1: the cluster tests (output to {log}, shown after) beside the multiproc and docs tests",
              flush=True)
        cluster, [others] = side_by_side([GPU_CHECK, "-m", "not alone"],
                                         [[*PYTEST, "tests/multiproc", "tests/docs", f"--ignore={GPU_CHECK}"]], log)
        print("\nround 2: the cluster tests marked alone beside the unit tests, then mypy", flush=True)
        alone, [unit, mypy] = side_by_side(["-m", "alone"], [[*PYTEST, "tests/unit"], [str(MYPY)]], log)
    results = {"cluster": cluster, "multiproc+docs": others, "cluster alone": alone, "unit": unit, "mypy": mypy}
    failed = [name for name, status in results.items() if not passed(status)]
    minutes = (time.monotonic() - started) / 60
    print(f"\ntests: {', '.join(f'{k} exit {v}' for k, v in results.items())}; {minutes:.1f} min in all"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
