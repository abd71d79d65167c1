"""Each rank's step time split into compute and waiting, gathered every few steps (train.stragglers
decides who is slow).

Measured on the host with `time.perf_counter`, no synchronisation per step:
- data: the time `next()` on the data loader takes;
- collective: from the moment the last gradient of a backward is accumulated on this rank (a
  post-accumulate-grad hook on every parameter) until backward returns. DDP all-reduces its buckets
  while backward runs and waits for the last ones at its end, so this is the time this rank waited
  for the others. The gather itself is also counted as collective time.
Every `every` optimizer steps one all_gather of four numbers per rank collects the splits (the first
time also the ranks' node names). Only
DDP's gradient sync is timed: under FSDP the parameter gathers are counted as compute, and with the
host running ahead of a GPU the host-side split shows less than the GPU does (see docs/training.md).
"""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.distributed as dist

from torchslurm.train.stragglers import MIN_GATHERS, RankTiming, Straggler, find_stragglers

if TYPE_CHECKING:
    from torch import nn

    from torchslurm.train.topology import Topology

T = TypeVar("T")
NAME_BYTES = 64
"""Of a node's name, what the ranks exchange: enough to tell Slurm's node names apart."""


def node_name(environ: Mapping[str, str]) -> str:
    """The Slurm node this rank runs on (SLURMD_NODENAME), else the host name."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


class StepTimes:
    """This rank's split of the steps since the last gather; every `every` steps all ranks gather theirs
    and rank 0 keeps the last `window` gathers and the stragglers they show (`stragglers`)."""

    def __init__(self, model: nn.Module, topo: Topology, node: str, *, every: int, window: int,
                 threshold: float, time_gradient_sync: bool, clock: Callable[[], float] = time.perf_counter) -> None:
        self.every = every if topo.world_size > 1 else 0
        self.topo, self.node, self.threshold, self._clock = topo, node, threshold, clock
        self.window: deque[list[RankTiming]] = deque(maxlen=window)
        self.nodes: list[str] = []
        self.stragglers: list[Straggler] = []
        self._steps, self._data, self._collective, self._since = 0, 0.0, 0.0, clock()
        self._last_grad: float | None = None
        self._paused_at: float | None = None
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready)  # type: ignore[no-untyped-call]
                       for p in model.parameters()
                       if p.requires_grad] if self.every and time_gradient_sync else []

    @property
    def window_steps(self) -> int:
        return self.every * len(self.window)

    def timed(self, loader: Iterable[T]) -> Iterator[T]:
        """`loader`'s items, the time spent waiting for each counted as data time."""
        if not self.every:
            yield from loader
            return
        start = self._clock()
        if self._paused_at is not None:  # validation and the epoch's checkpoint are not steps
            self._since += start - self._paused_at
        batches = iter(loader)
        while True:
            try:
                item = next(batches)
            except StopIteration:
                self._paused_at = self._clock()
                return
            finally:
                self._data += self._clock() - start
            yield item
            start = self._clock()

    def _grad_ready(self, _param: torch.Tensor) -> None:
        self._last_grad = self._clock()

    def backward_done(self) -> None:
        """Right after backward: the time since the last local gradient was waiting for the all-reduce."""
        if self._last_grad is not None:
            self._collective += self._clock() - self._last_grad
            self._last_grad = None

    def since_gather(self, now: float) -> RankTiming:
        """This rank's split of the optimizer steps since the last gather, up to `now` (a clock time)."""
        return RankTiming(self._steps, now - self._since, self._data, self._collective)

    def step_done(self, global_step: int) -> list[RankTiming] | None:
        """After each optimizer step (every rank); at a gather step: every rank's timing since the last
        gather (rank 0 also updates `stragglers`); None otherwise."""
        if not self.every:
            return None
        self._steps += 1
        if global_step % self.every:
            return None
        now = self._clock()
        t = self.since_gather(now)
        mine = torch.tensor([t.steps, t.elapsed_s, t.data_s, t.collective_s], dtype=torch.float64,
                            device=self.topo.device)
        rows = self._all_gather(mine)
        if not self.nodes:
            self.nodes = self._node_names()
        gather = [RankTiming(int(r[0]), r[1], r[2], r[3]) for r in rows]
        self.window.append(gather)
        if self.topo.rank == 0:
            self.stragglers = find_stragglers(self.window, self.nodes, self.threshold,
                                              min(MIN_GATHERS, self.window.maxlen or 1))
        self._steps, self._data, self._since = 0, 0.0, now
        self._collective = self._clock() - now  # the gather waited for the slowest rank
        return gather

    def _all_gather(self, mine: torch.Tensor) -> list[list[float]]:
        everyone = [torch.empty_like(mine) for _ in range(self.topo.world_size)]
        dist.all_gather(everyone, mine)
        rows: list[list[float]] = torch.stack(everyone).tolist()
        return rows

    def _node_names(self) -> list[str]:
        """Every rank's node, once per run: its name in NAME_BYTES bytes (no pickling, no object collective,
        which needs the right current CUDA device under NCCL)."""
        name = self.node.encode()[:NAME_BYTES].ljust(NAME_BYTES, b"\0")
        mine = torch.tensor(list(name), dtype=torch.uint8, device=self.topo.device)
        everyone = [torch.empty_like(mine) for _ in range(self.topo.world_size)]
        dist.all_gather(everyone, mine)
        return [bytes(t.tolist()).rstrip(b"\0").decode(errors="replace") for t in everyone]

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
