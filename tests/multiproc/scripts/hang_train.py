"""Training script of the hang tests: the Trainer on synthetic data, with hangs injected on one rank.

    python hang_train.py run_dir=DIR hang=KIND:RANK:STEP[:HOLD_S][,...] [hang_action=exit] [hang_s=3]

KIND (each after optimizer step STEP, on RANK only):
  loader — the rank's dataset blocks in __getitem__ (HOLD line below) for HOLD_S seconds (default: for good);
  lock   — a thread of the rank takes a lock, and the training thread waits for it (LOCK line) for HOLD_S;
  skip   — the other ranks all_reduce (ALL_REDUCE line); this rank skips it and waits in a barrier
           (BARRIER line): a collective mismatch, which never resolves.
Writes DIR/lines.txt (KIND=line of the wait) and DIR/rank<R>.pid; exit code 0 after training.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

import torchslurm
from torchslurm.errors import TorchSlurmError
from torchslurm.train import data
from torchslurm.train.trainer import TrainConfig, Trainer

HOLD: dict[str, float] = {}
"""Injected waits, by kind: seconds (inf: for good), armed at the step boundary."""


def _line(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}"))


def _seconds(hold_s: float) -> float | None:
    return None if hold_s == float("inf") else hold_s


class Blocking(Dataset[Any]):
    """A dataset that blocks in __getitem__ once the loader hang is armed."""

    def __init__(self, inner: Dataset[Any]) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        if "loader" in HOLD:
            threading.Event().wait(_seconds(HOLD.pop("loader")))  # HOLD
        return self.inner[index]


def deadlock(hold_s: float) -> None:
    lock = threading.Lock()
    taken = threading.Event()

    def holder() -> None:
        with lock:
            taken.set()
            threading.Event().wait(_seconds(hold_s))

    threading.Thread(target=holder, name="holder", daemon=True).start()
    taken.wait()
    with lock:  # LOCK
        pass


def main(args: dict[str, str]) -> int:
    run_dir = Path(args["run_dir"])
    hangs = [(h + ":inf").split(":")[:4] for h in args.get("hang", "").split(",") if h]
    with torchslurm.init(timeout_s=float(args.get("timeout_s", 60)), run_dir=run_dir) as ctx:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=f"[rank {ctx.rank}] %(message)s")
        (run_dir / f"rank{ctx.rank}.pid").write_text(str(os.getpid()))
        if ctx.rank == 0:
            markers = ("HOLD", "LOCK", "ALL_REDUCE", "BARRIER")
            (run_dir / "lines.txt").write_text("".join(f"{m}={_line(m)}\n" for m in markers))
        config = TrainConfig(epochs=int(args.get("epochs", 1)), batch_size=8, lr=0.05, seed=1, run_dir=run_dir,
                             log_every=0, checkpoint_every_epochs=0, hang_timeout_s=float(args.get("hang_s", 3)),
                             hang_action=args.get("hang_action", "exit"))
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))
        train, val = data.synthetic(num_samples=int(args.get("samples", 400)), seed=3)
        trainer: Trainer | None = None

        def boundary() -> bool:
            assert trainer is not None
            time.sleep(float(args.get("step_sleep", 0.02)))
            for kind, rank, step, hold in hangs:
                hold_s = float(hold)
                if int(rank) != ctx.rank and kind == "skip" and trainer.global_step == int(step):
                    dist.all_reduce(torch.ones(1))  # ALL_REDUCE
                if int(rank) != ctx.rank or trainer.global_step != int(step):
                    continue
                if kind == "loader":
                    HOLD["loader"] = hold_s
                elif kind == "lock":
                    deadlock(hold_s)
                elif kind == "skip":
                    dist.barrier()  # BARRIER
            return False

        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss(), Blocking(train),
                          val, config, ctx=ctx, should_stop=boundary)
        trainer.fit()
        trainer = None
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(dict(a.split("=", 1) for a in sys.argv[1:])))
    except TorchSlurmError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
