"""A rank whose start-up the test can signal: `startup_signal.py RUN_DIR`.

Writes RUN_DIR/phase as it goes ("importing", then "building", each with its pid) and waits at each phase for the test's
RUN_DIR/go-<phase> file: the test sends the job's warning signal while it waits. "importing" stands for
the seconds a rank spends importing torch (nothing of torchslurm has run), "building" for loading data
and building the model (torchslurm.init() has run, the Trainer does not listen yet). Then it trains with
the Trainer's own preemption and exits with its exit code (75 after a stop).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def phase(run_dir: Path, name: str) -> None:
    (run_dir / "phase.tmp").write_text(f"{name} {os.getpid()}")
    os.replace(run_dir / "phase.tmp", run_dir / "phase")
    while not (run_dir / f"go-{name}").exists():
        time.sleep(0.01)


def main(run_dir: Path) -> int:
    phase(run_dir, "importing")
    import torch
    from torch import nn

    import torchslurm
    from torchslurm.train import data
    from torchslurm.train.trainer import TrainConfig, Trainer

    with torchslurm.init(timeout_s=30) as ctx:
        phase(run_dir, "building")
        model = nn.Linear(10, 2)
        train, val = data.synthetic(num_samples=64, seed=3)
        config = TrainConfig(epochs=2, batch_size=16, run_dir=run_dir / "run", log_every=0)
        result = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss(), train, val,
                         config, ctx=ctx).fit()
        print(f"stopped early: {result.stopped_early} at step {result.global_step}", flush=True)
        return result.exit_code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
