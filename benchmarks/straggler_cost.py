"""What straggler detection costs a healthy run: the Trainer's training time with it off
(straggler_every=0), at its default (a gather every 50 steps), every 10 steps, and every step.

Same model (SimpleConvNet 8×8), data (digits), seed and batch size; 2 Gloo ranks. Every round trains
one epoch with each setting, in turn, so that load from other processes hits them alike; round 0 is
a warm-up. Reported: the median training time per optimizer step (the Trainer's own epoch_time_s:
the loop, not validation), and rank 0's CPU time for the whole fit() (less disturbed than wall time by
other processes on a shared machine), each with the median of the per-round ratios to `off`.

    python benchmarks/straggler_cost.py [--rounds 9] [--batch-size 8]
(starts its 2 ranks itself through `torchslurm run`).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SETTINGS = {"off": 0, "every 50 (default)": 50, "every 10": 10, "every step": 1}


def one_epoch(ctx: Any, train: Any, val: Any, batch_size: int, every: int, run_dir: Path) -> tuple[float, float]:
    """One epoch of the Trainer with straggler_every=`every`: its training loop's seconds and this process's
    CPU seconds in fit() (rank 0; zeros elsewhere)."""
    import torch

    from torchslurm.train.models import SimpleConvNet
    from torchslurm.train.trainer import TrainConfig, Trainer, seed_everything

    cfg = TrainConfig(epochs=1, batch_size=batch_size, lr=0.05, run_dir=run_dir, resume="never", log_every=0,
                      checkpoint_every_epochs=0, straggler_every=every)
    seed_everything(0)
    model = SimpleConvNet(8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = Trainer(model, optimizer, torch.nn.functional.cross_entropy, train, val, cfg, ctx=ctx)
    cpu = time.process_time()
    trainer.fit()
    cpu = time.process_time() - cpu
    if not ctx.is_main:
        return 0.0, 0.0
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return float([r for r in epochs if r["kind"] == "epoch"][-1]["epoch_time_s"]), cpu


def rank_main(rounds: int, batch_size: int) -> None:
    from torch.utils.data import DistributedSampler

    import torchslurm
    from torchslurm.train import data

    with torchslurm.init(backend="gloo") as ctx, tempfile.TemporaryDirectory() as tmp:
        train, val = data.digits()
        steps = math.ceil(len(DistributedSampler(train, ctx.world_size, ctx.rank)) / batch_size)
        ms: dict[str, list[float]] = {name: [] for name in SETTINGS}
        cpu: dict[str, list[float]] = {name: [] for name in SETTINGS}
        for r in range(rounds):
            for name, every in SETTINGS.items():
                seconds, cpu_s = one_epoch(ctx, train, val, batch_size, every, Path(tmp) / f"{r}-{every}")
                if r > 0:
                    ms[name].append(1000 * seconds / steps)
                    cpu[name].append(cpu_s)
        if ctx.is_main:
            print(f"straggler detection cost: 2 Gloo ranks, SimpleConvNet on digits, batch {batch_size}/rank, "
                  f"{steps} steps/epoch, {rounds - 1} epochs of each setting")
            print(f"  {'setting':20s} {'median':>8s} {'best':>8s} ms/step  {'ratio':>6s}   "
                  f"{'cpu s/fit':>9s} {'ratio':>6s}")
            for name, values in ms.items():
                ratio = statistics.median(v / o for v, o in zip(values, ms["off"], strict=True))
                cpu_ratio = statistics.median(v / o for v, o in zip(cpu[name], cpu["off"], strict=True))
                print(f"  {name:20s} {statistics.median(values):8.3f} {min(values):8.3f}          {ratio:6.3f}   "
                      f"{statistics.median(cpu[name]):9.3f} {cpu_ratio:6.3f}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    from _two_ranks import main

    sys.exit(main(__file__, __doc__, rank_main, rounds=9, batch_size=8))
