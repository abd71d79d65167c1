"""The command line of a benchmark whose body runs in 2 Gloo ranks: started plainly, it starts them
itself through `torchslurm run`; as a rank, it runs `rank_main(rounds, batch_size)`."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable


def main(script: str, doc: str | None, rank_main: Callable[[int, int], None], rounds: int, batch_size: int) -> int:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=rounds, help="rounds of each setting (the first is a warm-up)")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    args = parser.parse_args()
    if "RANK" not in os.environ:  # not a rank yet: start 2 with torchslurm run
        return subprocess.call([sys.executable, "-m", "torchslurm", "run", "--nproc", "2", script,
                                "--rounds", str(args.rounds), "--batch-size", str(args.batch_size)])
    rank_main(args.rounds, args.batch_size)
    return 0
