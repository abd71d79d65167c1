"""all_reduce bandwidth against the rank count: why `torchslurm bench` reports busbw.

Runs `torchslurm bench --ops all_reduce` with 2, 3 and 4 local Gloo ranks and prints algbw
(size / time) and busbw (algbw × 2(n-1)/n, nccl-tests' normalisation) side by side. algbw falls
as ranks are added although the links are the same; busbw is what to compare with the link's
rated bandwidth and across rank counts.

    python benchmarks/allreduce.py [--nprocs 2,3,4] [--sizes 64K,1M,16M] [--iters 10]
(on a shared 2-core machine the numbers are indicative only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def bench(nproc: int, sizes: str, iters: int) -> list[dict[str, float]]:
    """One `torchslurm bench` run; its JSON rows."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "MASTER_"))}
        subprocess.run([sys.executable, "-m", "torchslurm", "bench", "--nproc", str(nproc), "--ops", "all_reduce",
                        "--sizes", sizes, "--iters", str(iters), "--warmup", "3", "--json", str(out)],
                       check=True, env={**env, "TORCH_CPP_LOG_LEVEL": "ERROR"}, stdout=subprocess.DEVNULL)
        rows: list[dict[str, float]] = json.loads(out.read_text())["results"]
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", default="2,3,4")
    parser.add_argument("--sizes", default="64K,1M,16M")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    print(f"{'ranks':>5} {'bytes':>10} {'time (us)':>11} {'algbw GB/s':>11} {'busbw GB/s':>11}")
    for nproc in (int(n) for n in args.nprocs.split(",")):
        for row in bench(nproc, args.sizes, args.iters):
            print(f"{nproc:>5} {int(row['size_bytes']):>10} {row['time_us']:>11.1f} {row['algbw_gbps']:>11.4g} "
                  f"{row['busbw_gbps']:>11.4g}", flush=True)


if __name__ == "__main__":
    main()
