"""The namespace handshake under torchrun (torchslurm.runtime.handshake) at many ranks.

Every rank of a torchrun round asks rank 0 for the round's store namespace before the process
group forms. This starts a real TCPStore server (as torchrun's agent hosts it) and N ranks as
threads of this process, each with its own client connection, and times how long it takes until
every rank holds the namespace. Ranks start together, as after a restart. Reported: the median
and worst time over the rounds, per world size.

    python benchmarks/handshake.py [--world-sizes 16,64,256,1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta


def one_round(world_size: int, timeout_s: float) -> float:
    """Seconds until every rank of a fresh store has agreed on a namespace."""
    from torch.distributed import TCPStore

    from torchslurm.runtime.handshake import agree_namespace

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    # Connected beforehand and in parallel: one client connects in about 0.2 s here.
    with ThreadPoolExecutor(max_workers=128) as pool:
        clients = list(pool.map(lambda _: TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                                                   timeout=timedelta(seconds=timeout_s)), range(world_size)))
    start = threading.Barrier(world_size)
    found: list[str | None] = [None] * world_size

    def rank_main(rank: int) -> None:
        start.wait()
        found[rank] = agree_namespace(clients[rank], rank, world_size, timeout_s)

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(world_size)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - began
    assert len(set(found)) == 1 and found[0] is not None, "the ranks did not agree"
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", default="16,64,256,1024")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # before torch: a warning per client otherwise
    print(f"{'ranks':>6} {'median s':>9} {'worst s':>8}")
    for world_size in (int(n) for n in args.world_sizes.split(",")):
        times = [one_round(world_size, args.timeout_s) for _ in range(args.rounds)]
        print(f"{world_size:>6} {statistics.median(times):>9.3f} {max(times):>8.3f}", flush=True)


if __name__ == "__main__":
    main()
