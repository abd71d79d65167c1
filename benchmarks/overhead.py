"""Trainer overhead: torchslurm's Trainer against hand-written DDP loops.

Same model (SimpleConvNet 8×8), data (digits), seed, batch size and optimizer; 2 Gloo ranks.
Every round builds each loop afresh (model, DDP, optimizer — so each pays DDP's first-step
set-up once) and trains one epoch with it; the loops alternate round by round, so load from
other processes hits them alike; round 0 is a warm-up. Reported: the median training time per
optimizer step (data loading, forward, backward, all-reduce, step — not validation or
checkpointing), the best epoch (least disturbed by other load), and the ratios.

- bare: zero_grad / forward / loss / backward / step, nothing else;
- with metrics: the same plus the classic script's metrics (loss.item(), correct count per batch, one
  all_reduce per epoch) — what the Trainer also computes.

    python benchmarks/overhead.py [--rounds 13] [--batch-size 32]
(starts its 2 ranks itself through `torchslurm run`).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def hand_written_epoch(ctx: Any, train: Any, batch_size: int, epoch: int, metrics: bool) -> float:
    """A classic DDP loop for one epoch, built from scratch; seconds spent in the epoch's loop."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    from torchslurm.train.models import SimpleConvNet
    from torchslurm.train.trainer import seed_everything

    seed_everything(0)
    model = DistributedDataParallel(SimpleConvNet(8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler: DistributedSampler[Any] = DistributedSampler(train, ctx.world_size, ctx.rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=batch_size, sampler=sampler)
    sampler.set_epoch(epoch)
    model.train()
    total_loss, correct, seen = 0.0, 0, 0
    started = time.perf_counter()
    for inputs, targets in loader:
        optimizer.zero_grad()
        output = model(inputs)
        loss = torch.nn.functional.cross_entropy(output, targets)
        loss.backward()
        optimizer.step()
        if metrics:
            total_loss += loss.item() * len(targets)
            correct += int((output.argmax(dim=1) == targets).sum().item())
            seen += len(targets)
    if metrics:
        sums = torch.tensor([total_loss, correct, seen], dtype=torch.float64)
        dist.all_reduce(sums)
    return time.perf_counter() - started


def trainer_epoch(ctx: Any, train: Any, val: Any, batch_size: int, epoch: int, tmp: Path) -> float:
    """One epoch of the torchslurm Trainer; its own measurement of the epoch's training loop."""
    import torch

    from torchslurm.train.models import SimpleConvNet
    from torchslurm.train.trainer import TrainConfig, Trainer, seed_everything

    run_dir = tmp / f"round{epoch}"
    cfg = TrainConfig(epochs=1, batch_size=batch_size, lr=0.05, run_dir=run_dir, resume="never", log_every=0,
                      checkpoint_every_epochs=0, seed=epoch)
    seed_everything(0)
    model = SimpleConvNet(8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    Trainer(model, optimizer, torch.nn.functional.cross_entropy, train, val, cfg, ctx=ctx).fit()
    seconds = 0.0
    if ctx.is_main:
        seconds = float(json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["epoch_time_s"])
    return seconds


def rank_main(rounds: int, batch_size: int) -> None:
    from torch.utils.data import DistributedSampler

    import torchslurm
    from torchslurm.train import data

    with torchslurm.init(backend="gloo") as ctx, tempfile.TemporaryDirectory() as tmp_name:
        train, val = data.digits()
        steps = math.ceil(len(DistributedSampler(train, ctx.world_size, ctx.rank)) / batch_size)
        loops: dict[str, Callable[[int], float]] = {
            "hand-written, bare": lambda r: hand_written_epoch(ctx, train, batch_size, r, metrics=False),
            "hand-written, with metrics": lambda r: hand_written_epoch(ctx, train, batch_size, r, metrics=True),
            "torchslurm Trainer": lambda r: trainer_epoch(ctx, train, val, batch_size, r, Path(tmp_name)),
        }
        ms: dict[str, list[float]] = {name: [] for name in loops}
        for r in range(rounds):
            for name, loop in loops.items():
                seconds = loop(r)
                if r > 0:  # round 0 warms up every loop
                    ms[name].append(1000 * seconds / steps)
        if ctx.is_main:
            report(ms, steps, batch_size)


def report(ms: dict[str, list[float]], steps: int, batch_size: int) -> None:
    ours = ms["torchslurm Trainer"]
    print(f"overhead: 2 Gloo ranks, SimpleConvNet on digits, batch {batch_size}/rank, {steps} steps/epoch, "
          f"{len(ours)} epochs of each loop")
    print(f"  {'loop':26s} {'median':>8s} {'best':>8s}  ms/step")
    for name, values in ms.items():
        print(f"  {name:26s} {statistics.median(values):8.3f} {min(values):8.3f}")
    for name in ("hand-written, bare", "hand-written, with metrics"):
        paired = statistics.median(t / h for t, h in zip(ours, ms[name], strict=True))
        print(f"  Trainer / {name}: median of per-round ratios {paired:.3f}, ratio of bests "
              f"{min(ours) / min(ms[name]):.3f}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    from _two_ranks import main

    sys.exit(main(__file__, __doc__, rank_main, rounds=13, batch_size=32))
