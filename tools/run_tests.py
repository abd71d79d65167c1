"""The test suite as `make test` runs it: the cluster tests beside the others, then the few that must run alone.

    python tools/run_tests.py            what `make test` runs
    python tools/run_tests.py --serial   one plain `pytest` over everything, one test after another

Why two pytest processes at once: a cluster test spends much of its time waiting for Slurm (scheduling,
a job's start, a time limit, a requeue), and the unit, multiproc and docs tests mostly compute. Run one
after the other, each leaves the machine half idle; side by side they share it. They share nothing else:
only the cluster tests use the sandbox (its own network namespaces and Slurm), the others use loopback
and their own temporary folders.

A cluster test marked `alone` needs the machine to itself (its runs must start within a fixed part of a
one-minute Slurm time limit); those run after both processes have finished.

The cluster tests' output goes to a log file, shown whole once they finish; the others' streams to the
terminal. The exit status is non-zero when any of the three runs failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST = [sys.executable, "-m", "pytest"]
NO_TESTS = 5  # pytest's exit status when nothing was collected/selected


def passed(status: int) -> bool:
    return status in (0, NO_TESTS)


def run_side_by_side(log: Path) -> tuple[int, int]:
    """The cluster tests (to `log`) and every other test (to the terminal) at once; their exit statuses."""
    with log.open("w") as out:
        cluster = subprocess.Popen([*PYTEST, "tests/cluster", "-m", "not alone", "-p", "no:cacheprovider"],
                                   cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            others = subprocess.call([*PYTEST, "--ignore=tests/cluster"], cwd=ROOT)
        finally:
            cluster_status = cluster.wait()
    return cluster_status, others


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serial", action="store_true", help="one plain pytest run over everything")
    args = parser.parse_args(argv)
    if args.serial:
        return subprocess.call(PYTEST, cwd=ROOT)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torchslurm-tests-") as tmp:
        log = Path(tmp) / "cluster-tests.log"
        print(f"cluster tests run beside the others; their output follows theirs ({log})", flush=True)
        cluster, others = run_side_by_side(log)
        print(f"\n===== cluster tests (tests/cluster, exit {cluster}) =====", flush=True)
        sys.stdout.write(log.read_text(errors="replace"))
    print("\n===== cluster tests that need the machine to themselves (-m alone) =====", flush=True)
    alone = subprocess.call([*PYTEST, "tests/cluster", "-m", "alone", "-p", "no:cacheprovider"], cwd=ROOT)
    results = {"cluster": cluster, "others": others, "alone": alone}
    failed = [name for name, status in results.items() if not passed(status)]
    minutes = (time.monotonic() - started) / 60
    print(f"\ntests: {', '.join(f'{k} exit {v}' for k, v in results.items())}; {minutes:.1f} min in all"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
