"""Cluster-test rank: the Trainer with its own preemption and watchdog, on synthetic data; in the job's
first attempt (SLURM_RESTART_COUNT=0) the model on the job's second node (SLURM_NODEID=1) fails with
the error CUDA reports for an uncorrectable ECC error. Each rank writes `attempt<R>-rank<N>.host`.

    srun python badnode_train.py RUN_DIR
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path

import torch
from torch import nn

import torchslurm
from torchslurm.errors import TorchSlurmError
from torchslurm.train import data
from torchslurm.train.trainer import TrainConfig, Trainer

ECC = ("CUDA error: uncorrectable ECC error encountered\nCUDA kernel errors might be asynchronously reported at "
       "some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
       "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


class Model(nn.Module):
    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.net, self.calls, self.fail_at = nn.Linear(10, 2), 0, fail_at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError(ECC)
        out: torch.Tensor = self.net(x)
        return out


def main(run_dir: Path) -> int:
    attempt = os.environ.get("SLURM_RESTART_COUNT", "0")
    failing = attempt == "0" and os.environ.get("SLURM_NODEID") == "1"
    with torchslurm.init(timeout_s=60) as ctx:
        logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                            format=f"[rank {ctx.rank} {socket.gethostname()}] %(name)s %(message)s")
        (run_dir / f"attempt{attempt}-rank{ctx.rank}.host").write_text(socket.gethostname())
        torch.manual_seed(0)
        model = Model(fail_at=4 if failing else 0)
        train, val = data.synthetic(num_samples=200, seed=3)
        config = TrainConfig(epochs=1, batch_size=16, lr=0.05, run_dir=run_dir, log_every=0)
        try:
            Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss(), train, val,
                    config, ctx=ctx).fit()
        except TorchSlurmError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
