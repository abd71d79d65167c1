"""Trainer overhead: torchslurm's Trainer against a hand-written seed-style DDP loop.

Same model (SimpleConvNet 8×8), data (digits), seed, batch size and optimizer; 2 Gloo ranks. The
two loops alternate epoch by epoch (the first round is a warm-up and not counted) so that
load from other processes hits both alike. Reports the median training time per optimizer
step (data loading, forward, backward, all-reduce, step; not validation or checkpointing).

    python benchmarks/overhead.py [--rounds 11] [--batch-size 32]
(starts its 2 ranks itself through `torchslurm run`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def hand_written_epoch(model, optimizer, loader, sampler, epoch: int) -> float:  # type: ignore[no-untyped-def]
    """Seed 002's loop: set_epoch, zero_grad / forward / loss / backward / step. Seconds taken."""
    import torch

    sampler.set_epoch(epoch)
    model.train()
    started = time.perf_counter()
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
    return time.perf_counter() - started


def rank_main(rounds: int, batch_size: int) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    import torchslurm
    from torchslurm import data
    from torchslurm.models import SimpleConvNet
    from torchslurm.trainer import TrainConfig, Trainer, seed_everything

    with torchslurm.init(backend="gloo") as ctx:
        train, val = data.digits()
        steps = math.ceil(len(DistributedSampler(train, ctx.world_size, ctx.rank)) / batch_size)
        seed_everything(0)
        hand_model = DistributedDataParallel(SimpleConvNet(8))
        hand_opt = torch.optim.SGD(hand_model.parameters(), lr=0.05, momentum=0.9)
        sampler = DistributedSampler(train, ctx.world_size, ctx.rank, shuffle=True, seed=0)
        loader = DataLoader(train, batch_size=batch_size, sampler=sampler)
        hand_ms, trainer_ms = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(rounds):
                seconds = hand_written_epoch(hand_model, hand_opt, loader, sampler, r)
                run_dir = Path(tmp) / f"round{r}"
                cfg = TrainConfig(epochs=1, batch_size=batch_size, lr=0.05, run_dir=run_dir, resume="never",
                                  log_every=0, checkpoint_every_epochs=0, seed=r)
                seed_everything(0)
                model = SimpleConvNet(8)
                opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
                Trainer(model, opt, torch.nn.functional.cross_entropy, train, val, cfg, ctx=ctx).fit()
                if ctx.is_main and r > 0:  # round 0 warms up both
                    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
                    hand_ms.append(1000 * seconds / steps)
                    trainer_ms.append(1000 * record["epoch_time_s"] / steps)
        if ctx.is_main:
            hand, ours = statistics.median(hand_ms), statistics.median(trainer_ms)
            print(f"overhead: 2 Gloo ranks, SimpleConvNet on digits, batch {batch_size}/rank, {steps} steps/epoch, "
                  f"median of {len(hand_ms)} epochs each")
            print(f"  hand-written DDP loop  {hand:8.3f} ms/step   (all: {', '.join(f'{x:.2f}' for x in hand_ms)})")
            print(f"  torchslurm Trainer     {ours:8.3f} ms/step   (all: {', '.join(f'{x:.2f}' for x in trainer_ms)})")
            paired = statistics.median(t / h for t, h in zip(trainer_ms, hand_ms, strict=True))
            print(f"  ratio Trainer / hand   {ours / hand:8.3f}   (median of per-epoch ratios: {paired:.3f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=11, help="epochs of each loop (the first is a warm-up)")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    if "RANK" not in os.environ:  # not a rank yet: start 2 with torchslurm run
        return subprocess.call([sys.executable, "-m", "torchslurm", "run", "--nproc", "2", __file__,
                                "--rounds", str(args.rounds), "--batch-size", str(args.batch_size)])
    rank_main(args.rounds, args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
