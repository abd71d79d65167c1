"""One rank of one peer run: `worker.py FRAMEWORK --workload ... --out record.json`, under torchrun.

Started by benchmarks/peers.py as
    python -m torch.distributed.run --standalone --nproc-per-node 2 worker.py FRAMEWORK ...
Each framework's loop lives in its own module (peer_<framework>.py), written the way a user of
that framework writes it.
"""

from __future__ import annotations

import time

PROCESS_START = time.perf_counter()  # before any heavy import: start-up to the first step is measured from here

import importlib  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from common import StepClock, parse_spec, write_record  # noqa: E402

MODULES = {"seed": "peer_seed", "torchslurm": "peer_torchslurm", "fabric": "peer_fabric",
           "lightning": "peer_lightning", "accelerate": "peer_accelerate"}


def main(argv: Sequence[str] | None = None) -> int:
    spec = parse_spec(argv)
    if spec.framework not in MODULES:
        print(f"error: unknown framework {spec.framework!r}; expected one of {', '.join(MODULES)}", file=sys.stderr)
        return 2
    clock = StepClock(PROCESS_START)
    outcome = importlib.import_module(MODULES[spec.framework]).train(spec, clock)
    write_record(spec, clock, outcome)
    tear_down()
    return 0


def tear_down() -> None:
    """Destroy the process group, after the run's models are gone and every rank got here.

    With Gloo, torch 2.13 aborts a process now and then at exit ("terminate called without an
    active exception") when a DistributedDataParallel model outlives its group, whichever
    framework built it; so the frameworks' objects (freed when `train` returned) are collected first.
    """
    import gc

    import torch.distributed as dist

    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
