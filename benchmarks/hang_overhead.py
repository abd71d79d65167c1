"""What the hang detector costs a healthy run: whole short Trainer runs with and without it.

2 Gloo ranks train SimpleConvNet on digits for one epoch per run (7 ms steps or so: a fast loop, where a
per-step cost shows most). Each round runs every variant once, in alternating order, so load from other
processes hits them alike; round 0 is a warm-up. Variants:

- off: hang_action=off (no detector thread; `torchslurm stacks`' responder runs in every variant: init()
  starts it);
- derived: the default (hang_timeout_s=0: the thread ticks once a second);
- 3s: hang_timeout_s=3 (the thread ticks every 0.3 s: the tests' setting, ten times the store traffic of
  a 30 s timeout).

Reported: the median wall time of fit() per variant over the measured rounds, its ratio to off, and the
median of the per-round ratios (each round's variants ran back to back: slow drifts of the load cancel).

    python benchmarks/hang_overhead.py [--rounds 9]
(starts its 2 ranks itself through `torchslurm run`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {"off": {"hang_action": "off"}, "derived": {"hang_action": "exit"},
            "3s": {"hang_action": "exit", "hang_timeout_s": 3.0}}


def worker(rounds: int, out: Path, scratch: Path) -> None:
    import torch
    from torch import nn

    import torchslurm
    from torchslurm.train.data import digits
    from torchslurm.train.models import SimpleConvNet
    from torchslurm.train.trainer import TrainConfig, Trainer

    train, val = digits()
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with torchslurm.init() as ctx:
        for round_ in range(rounds + 1):
            order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                torch.manual_seed(0)
                model = SimpleConvNet(8)
                config = TrainConfig(epochs=1, batch_size=16, lr=0.05, log_every=0, resume="never",
                                     run_dir=scratch / f"{name}-{round_}", **VARIANTS[name])  # type: ignore[arg-type]
                trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss(),
                                  train, val, config, ctx=ctx, should_stop=lambda: False)
                started = time.perf_counter()
                trainer.fit()
                if round_:
                    times[name].append(time.perf_counter() - started)
                del trainer
        if ctx.is_main:
            out.write_text(json.dumps(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.worker, args.worker.parent)
        return
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "times.json"
        subprocess.run([sys.executable, "-m", "torchslurm", "run", "--nproc", "2", __file__, "--rounds",
                        str(args.rounds), "--worker", str(out)], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        times = json.loads(out.read_text())
    base = statistics.median(times["off"])
    print(f"{'variant':<8} {'median fit() s':>14} {'ratio':>6} {'paired ratio':>12}   "
          f"(2 Gloo ranks, digits, {args.rounds} rounds)")
    for name, values in times.items():
        median = statistics.median(values)
        paired = statistics.median(v / o for v, o in zip(values, times["off"], strict=True))
        print(f"{name:<8} {median:>14.3f} {median / base:>6.3f} {paired:>12.3f}")


if __name__ == "__main__":
    main()
