"""A small byte-level GPT on the Python standard library's own source, sharded with FSDP2.

    torchslurm run --nproc 2 examples/gpt.py            # or under sbatch: srun python examples/gpt.py

The Trainer does the sharding (strategy=fsdp); in a loop of your own, call
`torchslurm.train.fsdp.shard_model(model, wrap=("Block",))` after torchslurm.init() instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import torchslurm
from torchslurm.train import tasks
from torchslurm.train.models import GPT
from torchslurm.train.text import stdlib_text
from torchslurm.train.trainer import TrainConfig, Trainer, seed_everything


def main() -> int:
    cfg = TrainConfig(epochs=2, batch_size=32, lr=0.003, run_dir=Path("runs/gpt-example"), log_every=20,
                      strategy="fsdp", fsdp_wrap="Block", checkpoint_async=True, checkpoint_every_steps=50)
    with torchslurm.init() as ctx:
        train, val = stdlib_text(block_size=64)
        seed_everything(cfg.seed)  # the same initial weights on every rank
        model = GPT(block_size=64)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        result = Trainer(model, optimizer, tasks.token_cross_entropy, train, val, cfg, ctx=ctx,
                         task=tasks.language_model(model.flops_per_token())).fit()
        if ctx.is_main and result.val is not None:
            print(f"validation loss {result.val.avg_loss:.4f} per token")
        return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
