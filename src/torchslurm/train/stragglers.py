"""Who is a straggler, given a window of per-rank step timings: pure, torch-free.

Every rank of a synchronous data-parallel run takes the same wall time per step: a slow rank makes
the others wait for it in the gradient all-reduce. So the wall time says nothing about who is slow;
the split does. Each rank measures, over the steps between two gathers, how long it waited (for its
data loader, in collectives) and counts the rest as its own compute. A straggler computes longer than
the others and waits less.

The rule (see docs/training.md, "Stragglers"): for each gather, a rank's *ratio* is its compute time
per step (everything but waiting for other ranks: its forward, backward and optimizer, and its own
data loading) over the median of the other ranks'; a rank is named when the median of its ratios over the
last `window` gathers is at least `threshold` (default 1.3). The median over the window makes one
spike (a checkpoint, a page-cache miss, a preempted core) harmless, and a rank that becomes slow is
named once more than half of the window's gathers saw it slow. When every rank of a node (of a run
with several nodes) is slow, the node is named instead of its ranks.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_THRESHOLD = 1.3
"""Compute time per step, as a multiple of the median of the other ranks', from which a rank is slow."""
MIN_GATHERS = 3
"""Gathers a decision needs at least (fewer when the window is shorter): one spike is never a verdict."""


@dataclass(frozen=True)
class RankTiming:
    """One rank's account of the steps since the previous gather, in seconds."""

    steps: int
    elapsed_s: float
    """Wall time of those steps."""
    data_s: float
    """Waiting for the data loader's next batch (and its copy to the device)."""
    collective_s: float
    """Blocked in collectives: the gradient all-reduce after the local backward, and the gather itself."""

    @property
    def wait_s(self) -> float:
        return self.data_s + self.collective_s

    @property
    def compute_s(self) -> float:
        """The rest of the step: forward, backward, optimizer, the loop's own work."""
        return max(self.elapsed_s - self.wait_s, 0.0)

    @property
    def own_s(self) -> float:
        """Time not spent waiting for other ranks: compute and this rank's own data loading. What a
        straggler has more of (a slow GPU or CPU, or a slow data loader or file system on its node)."""
        return max(self.elapsed_s - self.collective_s, 0.0)

    def per_step(self, seconds: float) -> float:
        return seconds / self.steps if self.steps > 0 else 0.0


@dataclass(frozen=True)
class Straggler:
    """A rank, or a whole node, that computes `ratio` times longer than the median of the others."""

    ranks: tuple[int, ...]
    node: str
    ratio: float
    whole_node: bool
    """True when every rank of `node` is slow (and the run has other nodes): the node is the suspect."""
    data_share: float = 0.0
    """The share of its time these ranks spent waiting for their data loader."""

    def describe(self, steps: int) -> str:
        """`node3 (ranks 12-15) 1.6× the median compute time for the last 200 steps`."""
        cause = ", mostly waiting for its data loader" if self.data_share > 0.5 else ""
        tail = f"{self.ratio:.1f}× the median compute time{cause} for the last {steps} steps"
        if self.whole_node:
            return f"{self.node} ({_ranks_text(self.ranks)}) {tail}"
        return f"rank {self.ranks[0]} on {self.node} {tail}"

    def to_dict(self, steps: int) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "node": self.node, "ratio": round(self.ratio, 3),
                "whole_node": self.whole_node, "data_share": round(self.data_share, 3), "text": self.describe(steps)}


def ratios(gather: Sequence[RankTiming]) -> list[float]:
    """Each rank's own time per step over the median of the other ranks' (1.0 when they had none).
    O(W log W): at thousands of ranks the median of the others comes from one sorted list."""
    own = [t.per_step(t.own_s) for t in gather]
    order = sorted(range(len(own)), key=own.__getitem__)
    ranked = [own[r] for r in order]
    out: dict[int, float] = {}
    for position, rank in enumerate(order):
        others = _median_without(ranked, position)
        out[rank] = own[rank] / others if others > 0 else 1.0
    return [out[rank] for rank in range(len(own))]


def _median_without(ranked: Sequence[float], position: int) -> float:
    """The median of sorted `ranked` once the value at `position` is left out."""
    n = len(ranked) - 1
    if n <= 0:
        return 0.0

    def at(i: int) -> float:
        return ranked[i if i < position else i + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def find_stragglers(window: Sequence[Sequence[RankTiming]], nodes: Sequence[str],
                    threshold: float = DEFAULT_THRESHOLD, min_gathers: int = MIN_GATHERS) -> list[Straggler]:
    """The slow ranks and nodes of `window` (gathers oldest first, each one timing per rank; `nodes[r]` is
    the host of rank r), slowest first; [] for one rank, or while the window holds fewer than `min_gathers`."""
    world = len(nodes)
    if world < 2 or len(window) < max(min_gathers, 1):
        return []
    if any(len(gather) != world for gather in window):
        raise ValueError(f"every gather needs one timing per rank ({world}); got {[len(g) for g in window]}")
    per_gather = [ratios(gather) for gather in window]
    typical = [statistics.median(g[rank] for g in per_gather) for rank in range(world)]
    slow = {rank for rank in range(world) if typical[rank] >= threshold}
    share = {rank: statistics.median(g[rank].data_s / g[rank].own_s if g[rank].own_s > 0 else 0.0 for g in window)
             for rank in slow}
    return sorted(_group(slow, typical, share, nodes), key=lambda s: -s.ratio)


def _group(slow: set[int], typical: Sequence[float], share: Mapping[int, float],
           nodes: Sequence[str]) -> list[Straggler]:
    by_node: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        by_node.setdefault(node, []).append(rank)
    several_nodes = len(by_node) > 1
    out = []
    for node, ranks in by_node.items():
        hit = [r for r in ranks if r in slow]
        if several_nodes and len(ranks) > 1 and len(hit) == len(ranks):
            out.append(Straggler(tuple(ranks), node, statistics.median(typical[r] for r in ranks), True,
                                 statistics.median(share[r] for r in ranks)))
        else:
            out.extend(Straggler((r,), node, typical[r], False, share[r]) for r in hit)
    return out


def needed_gathers(window: int) -> int:
    """Gathers after a rank turns slow before it is named: more than half of the window."""
    return window // 2 + 1


def summary(stragglers: Sequence[Straggler], steps: int) -> str:
    """One line for the progress line and `status`: the stragglers described, or '' when none."""
    return "; ".join(s.describe(steps) for s in stragglers)


def gather_record(step: int, gather: Sequence[RankTiming], stragglers: Sequence[Straggler],
                  window_steps: int) -> dict[str, Any]:
    """The record of one gather (run_dir's STRAGGLERS_FILE; the Trainer adds all but its kind and step to
    its step records in metrics.jsonl): medians across ranks of the split (seconds per step), the
    slowest rank's ratio, and who is named."""
    r = ratios(gather)
    slowest = max(range(len(r)), key=r.__getitem__) if r else 0

    def median(values: Sequence[float]) -> float:
        return statistics.median(values) if values else 0.0

    return {"kind": "steptime", "step": step,
            "compute_s": median([t.per_step(t.compute_s) for t in gather]),
            "collective_s": median([t.per_step(t.collective_s) for t in gather]),
            "data_s": median([t.per_step(t.data_s) for t in gather]),
            "slowest_rank": slowest, "slowest_ratio": r[slowest] if r else 1.0,
            "stragglers": len(stragglers),
            "named": [s.to_dict(window_steps) for s in stragglers]}


STRAGGLERS_FILE = "stragglers.json"
"""In run_dir: rank 0's latest gather_record, rewritten at each gather; `torchslurm status` reads it."""


def status_lines(health: Mapping[str, Any]) -> list[str]:
    """What `torchslurm status` shows of a run's STRAGGLERS_FILE."""
    named = health.get("named") or []
    step = health.get("step", "?")
    if not named:
        return [f"stragglers: none (step {step})"]
    return [f"straggler: {s['text']} (step {step})" for s in named]


def _ranks_text(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return "ranks " + ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)
