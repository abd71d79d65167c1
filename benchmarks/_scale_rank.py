"""One rank of benchmarks/scale.py, started by srun (one task per sandbox node).

    python _scale_rank.py bare           init_process_group from SLURM_PROCID/SLURM_NTASKS and the
                                         MASTER_ADDR/MASTER_PORT the batch script exported (what a
                                         user writes without torchslurm), then one all_reduce
    python _scale_rank.py init           torchslurm.init(), then one all_reduce (also what
                                         `torchslurm run --nproc 1` starts)
    python _scale_rank.py traffic S OUT  torchslurm.init(), then the Trainer's watchdog and hang
                                         detector for S seconds with a step every 0.1 s, counting
                                         every call they make on the job's store; rank 0 writes
                                         the totals to OUT (JSON)
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any


def one_all_reduce() -> None:
    import torch
    import torch.distributed as dist

    total = torch.ones(1)
    dist.all_reduce(total)
    if int(total.item()) != dist.get_world_size():
        raise SystemExit(f"all_reduce gave {total.item()}, expected {dist.get_world_size()}")


def bare() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", rank=int(os.environ["SLURM_PROCID"]),
                            world_size=int(os.environ["SLURM_NTASKS"]))
    one_all_reduce()
    dist.destroy_process_group()


def init() -> None:
    import torchslurm

    with torchslurm.init():
        one_all_reduce()


class CountingStore:
    """A store client that counts the calls made through it, per method."""

    def __init__(self, inner: Any, counts: collections.Counter[str], lock: threading.Lock) -> None:
        self._inner, self._counts, self._lock = inner, counts, lock

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self._counts[name] += 1
            return method(*args, **kwargs)
        return counted


def traffic(seconds: float, out: Path) -> None:
    import torch
    import torch.distributed as dist

    import torchslurm
    from torchslurm.train import hang, watchdog

    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    real_client = watchdog.store_client

    def counting_client(ctx: Any, timeout_s: float = watchdog.STORE_TIMEOUT_S) -> Any:
        with lock:
            counts["connect"] += 1
        return CountingStore(real_client(ctx, timeout_s), counts, lock)

    watchdog.store_client = counting_client  # type: ignore[assignment]
    hang.store_client = counting_client  # type: ignore[attr-defined]
    with torchslurm.init() as ctx:
        detector = hang.HangDetector(ctx, 0.0, "exit", Path(os.environ.get("TMPDIR", "/tmp")))
        with watchdog.Watchdog(ctx), detector:
            started = time.monotonic()
            while time.monotonic() - started < seconds:
                time.sleep(0.1)
                detector.step_done()
            elapsed = time.monotonic() - started
        names = sorted({"connect", "add", "check", "get", "set"} | set(counts))
        mine = torch.tensor([float(counts[n]) for n in names])
        dist.all_reduce(mine)
        if ctx.rank == 0:
            totals = dict(zip(names, (int(v) for v in mine.tolist()), strict=True))
            calls = sum(v for k, v in totals.items() if k != "connect")
            out.write_text(json.dumps({"ranks": ctx.world_size, "seconds": round(elapsed, 1), "calls": totals,
                                       "calls_per_s": round(calls / elapsed, 1),
                                       "per_rank_per_s": round(calls / elapsed / ctx.world_size, 2)}))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "bare":
        bare()
    elif mode == "init":
        init()
    elif mode == "traffic":
        traffic(float(sys.argv[2]), Path(sys.argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode!r}: expected bare, init or traffic")
