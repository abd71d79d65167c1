"""Collective bandwidth benchmark: all_reduce / all_gather / broadcast over message sizes.

The numbers follow nccl-tests (doc/PERFORMANCE.md), so they compare with published results:
algbw = size / time, and busbw = algbw × a factor that makes it comparable with the link's
hardware bandwidth whatever the rank count n: 2(n-1)/n for all_reduce, (n-1)/n for all_gather
(size = the gathered output), 1 for broadcast. The time of one iteration is averaged over the
iterations and then over the ranks (nccl-tests' default, `-a 1`).

The pure parts (sizes, formulas, the table) need no torch; `run()` imports it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchslurm.errors import ConfigError, below_minimum, not_one_of
from torchslurm.runtime.devices import BACKENDS

if TYPE_CHECKING:
    from torchslurm.runtime.distributed import DistContext

__all__ = ["OPS", "BenchConfig", "BenchResult", "bandwidth", "bus_factor", "format_size", "parse_sizes",
           "render_table", "run"]

logger = logging.getLogger(__name__)

OPS = ("all_reduce", "all_gather", "broadcast")
DEFAULT_SIZES = "1K,64K,1M,16M,64M"
ELEMENT_BYTES = 4  # float32
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"\s*([0-9]{1,15})\s*([KMG]?)(I?B)?\s*", re.IGNORECASE)


@dataclass(frozen=True)
class BenchConfig:
    """What to measure."""

    ops: tuple[str, ...] = OPS
    """Collectives to time, from OPS."""
    sizes: tuple[int, ...] = ()
    """Message sizes in bytes (nccl-tests' meaning; rounded down to whole float32 elements per rank)."""
    iters: int = 20
    """Timed iterations per size."""
    warmup: int = 5
    """Untimed iterations per size first (connection set-up, allocator, NCCL's first-call cost)."""
    backend: str | None = None
    """'gloo' or 'nccl'; None: NCCL with GPUs, else Gloo (torchslurm.init's choice)."""

    def __post_init__(self) -> None:
        unknown = [op for op in self.ops if op not in OPS]
        if unknown or not self.ops:
            raise ConfigError(f"--ops={','.join(self.ops)!r}: {', '.join(unknown) or 'empty'} is not a collective "
                              "this benchmark runs.", f"choose from {', '.join(OPS)}.")
        if not self.sizes:
            object.__setattr__(self, "sizes", parse_sizes(DEFAULT_SIZES))
        if self.iters < 1:
            raise below_minimum("--iters", self.iters, 1, hint="--iters 20.")
        if self.warmup < 0:
            raise below_minimum("--warmup", self.warmup, 0, hint="--warmup 5.")
        if self.backend not in (None, *BACKENDS):
            raise not_one_of("--backend", self.backend, BACKENDS,
                             hint="choose gloo or nccl, or leave it unset (NCCL on GPUs, Gloo on CPUs).")


@dataclass(frozen=True)
class BenchResult:
    """One row of the table."""

    op: str
    """The collective."""
    size_bytes: int
    """Bytes moved in nccl-tests' sense (for all_gather: the whole gathered output)."""
    world_size: int
    """Ranks that took part."""
    iters: int
    """Timed iterations."""
    time_us: float
    """Mean time of one iteration, averaged over the ranks, in microseconds."""
    algbw_gbps: float
    """size / time, in GB/s (10^9 bytes)."""
    busbw_gbps: float
    """algbw × bus_factor(op, world_size), in GB/s."""


def parse_sizes(text: str) -> tuple[int, ...]:
    """'1K,64K,1M' → bytes (binary units like nccl-tests: 1K = 1024; B, KB, KiB accepted)."""
    sizes = []
    for part in (p for p in text.split(",") if p.strip()):
        match = _SIZE.fullmatch(part)
        if match is None or int(match.group(1)) == 0:
            raise ConfigError(f"--sizes: {part.strip()!r} is not a message size.",
                              "sizes such as --sizes 4K,1M,64M (bytes, with K/M/G = 1024-based units).")
        sizes.append(int(match.group(1)) * _UNITS[match.group(2).upper()])
    if not sizes:
        raise ConfigError(f"--sizes={text!r} lists no size.", f"--sizes {DEFAULT_SIZES}.")
    return tuple(sizes)


def format_size(size: int) -> str:
    """Bytes in the shortest exact binary unit: 1024 → '1K', 1536 → '1536'."""
    for unit in ("G", "M", "K"):
        if size >= _UNITS[unit] and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size)


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw/algbw factor for `op` on `world_size` ranks."""
    n = world_size
    factors = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "broadcast": 1.0}
    if op not in factors:
        raise not_one_of("op", op, OPS, hint=f"choose from {', '.join(OPS)}: these have a bus bandwidth formula.")
    return factors[op]


def bandwidth(op: str, size_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for moving size_bytes with `op` in `seconds`."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * bus_factor(op, world_size)


def elements_per_rank(op: str, size_bytes: int, world_size: int) -> int:
    """float32 elements in each rank's buffer (all_gather: each rank holds 1/n of the output)."""
    share = world_size if op == "all_gather" else 1
    return max(1, size_bytes // (ELEMENT_BYTES * share))


def render_table(results: Sequence[BenchResult], header: str = "") -> str:
    """The nccl-tests-style table, one row per (op, size)."""
    lines = [header] if header else []
    lines.append(f"{'op':<11} {'size':>8} {'bytes':>12} {'time (us)':>12} {'algbw GB/s':>11} {'busbw GB/s':>11}")
    for r in results:
        lines.append(f"{r.op:<11} {format_size(r.size_bytes):>8} {r.size_bytes:>12} {r.time_us:>12.1f} "
                     f"{r.algbw_gbps:>11.4g} {r.busbw_gbps:>11.4g}")  # 4 digits: small sizes are not 0.000
    for op in dict.fromkeys(r.op for r in results):
        rows = [r for r in results if r.op == op]
        peak = max(rows, key=lambda r: r.busbw_gbps)
        lines.append(f"peak {op} busbw: {peak.busbw_gbps:.4g} GB/s at {format_size(peak.size_bytes)}")
    return "\n".join(lines) + "\n"


def to_json(results: Sequence[BenchResult], ctx: DistContext) -> dict[str, Any]:
    """What `--json FILE` holds: the placement and every row."""
    return {
        "world_size": ctx.world_size, "num_nodes": ctx.env.num_nodes, "backend": ctx.backend,
        "device": str(ctx.device), "launcher": ctx.env.launcher,
        "results": [vars(r) for r in results],
    }


def run(config: BenchConfig, ctx: DistContext) -> list[BenchResult]:
    """Time every (op, size) on every rank of ctx's group; all ranks get the same results."""
    results = []
    for op in config.ops:
        for size in config.sizes:
            seconds = _time_op(op, size, config, ctx)
            count = elements_per_rank(op, size, ctx.world_size)
            moved = count * ELEMENT_BYTES * (ctx.world_size if op == "all_gather" else 1)
            algbw, busbw = bandwidth(op, moved, seconds, ctx.world_size)
            results.append(BenchResult(op, moved, ctx.world_size, config.iters, seconds * 1e6, algbw, busbw))
            logger.debug("%s %s: %.1f us, busbw %.3f GB/s", op, format_size(moved), seconds * 1e6, busbw)
    return results


def _time_op(op: str, size: int, config: BenchConfig, ctx: DistContext) -> float:
    """Mean seconds per iteration of `op`, averaged over the ranks."""
    import torch
    import torch.distributed as dist

    count = elements_per_rank(op, size, ctx.world_size)
    buffer = torch.zeros(count, dtype=torch.float32, device=ctx.device)  # sums stay finite
    output = torch.empty(count * ctx.world_size, dtype=torch.float32, device=ctx.device)
    # torch 2.13 renamed all_gather_into_tensor (deprecated) to all_gather_single; older ones lack it.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def once() -> None:
        if op == "all_reduce":
            dist.all_reduce(buffer)
        elif op == "all_gather":
            gather(output, buffer)
        else:
            dist.broadcast(buffer, src=0)

    def sync() -> None:
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)

    for _ in range(config.warmup):
        once()
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(config.iters):
        once()
    sync()
    elapsed = torch.tensor([(time.perf_counter() - start) / config.iters], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(elapsed)
    return float(elapsed.item()) / ctx.world_size
