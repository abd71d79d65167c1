"""One rank's part of an exact validation: its shard of a dataset (each sample on exactly one rank),
summed as train.metrics' [loss·n, extra, n], with every random stream put back as it was, so that how
often a run validates never changes its training. The all_reduce of the sums is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from torchslurm.train.batches import to_device
from torchslurm.train.data import ShardSampler, batches
from torchslurm.train.rng import rng_state, set_rng_state
from torchslurm.train.step import Stepper
from torchslurm.train.strategy import Strategy
from torchslurm.train.topology import Topology


@dataclass(frozen=True)
class Validator:
    """What a validation pass reads: the strategy's evaluation module, the step that makes a batch's
    loss, and how batches are loaded; `beat` is called after every batch (the hang detector's)."""

    strategy: Strategy
    stepper: Stepper
    topo: Topology
    batch_size: int
    seed: int
    loading: dict[str, Any]
    """The DataLoader's options: num_workers, pin_memory, collate_fn."""
    beat: Callable[[], None]

    def sums(self, data: Dataset[Any]) -> torch.Tensor:
        """This rank's sums over its shard of `data`; the random streams as they were before."""
        streams = rng_state()
        try:
            return self._sums(data)
        finally:
            set_rng_state(streams)

    def _sums(self, data: Dataset[Any]) -> torch.Tensor:
        device = self.topo.device
        sampler = ShardSampler(len(data), self.topo.rank, self.topo.world_size)  # type: ignore[arg-type]
        loader = batches(data, sampler, self.batch_size, generator=torch.Generator().manual_seed(self.seed),
                         **self.loading)
        sums = torch.zeros(3, dtype=torch.float64, device=device)
        model = self.strategy.eval_module.eval()  # DDP: the unwrapped module, no hooks or collectives per batch
        with torch.no_grad():
            for batch in loader:  # copied as training's are: without waiting for the device's queue
                found = self.stepper.forward(model, to_device(batch, device, non_blocking=True), evaluating=True)
                sums += self.stepper.sums(found)
                self.beat()
            one = DataLoader(data, batch_size=1, collate_fn=self.loading.get("collate_fn"))
            self.strategy.pad_evaluation(data, len(loader), self.batch_size, lambda: self.stepper.forward(
                model, to_device(next(iter(one)), device), evaluating=True))
        model.train()
        return sums
