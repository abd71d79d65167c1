"""FSDP against DDP on a model that fits: the step-time cost of sharding, and the memory it saves.

The same GPT (`--dim`, `--layers`), data, seed and AdamW on 2 Gloo ranks. Step time: both
strategies live in the same ranks and take turns, `--steps` optimizer steps each per round, so
load from other processes hits them alike; round 0 warms up. Reported: the median time per step
(forward, backward, gradient all-reduce or reduce-scatter, clip-free AdamW step) and FSDP / DDP.

Memory per rank, two measures:
- state bytes: the parameters, gradients and optimizer state a rank holds after a step, counted
  from the live tensors (for FSDP their local shards) — exact, and what grows with the model;
- peak RSS delta: in a fresh rank process per strategy (a peak cannot be split between two models
  in one process), the resident-set peak while taking `--steps` steps (VmHWM, reset after the
  model is built and sharded), minus the resident set before the model was built; it includes
  activations, FSDP's gathered parameters, DDP's gradient buckets, Gloo buffers and allocator slack.
  The larger of the two ranks is reported.

    python benchmarks/fsdp_vs_ddp.py [--dim 384] [--layers 6] [--rounds 6] [--steps 5]
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
from typing import Any

BLOCK, BATCH = 64, 8
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536"}
"""glibc's malloc keeps freed large blocks in its heap once its dynamic mmap threshold has grown, so the
resident set would count memory that is free; a fixed threshold maps (and unmaps) large blocks."""


def build(strategy: str, dim: int, layers: int) -> tuple[Any, Any, Any]:
    """(module to call, model, optimizer) for one strategy, from the same initial weights."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from torchslurm.train import fsdp
    from torchslurm.train.models import GPT

    torch.manual_seed(0)
    model = GPT(block_size=BLOCK, dim=dim, layers=layers, heads=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if strategy == "ddp":
        return DistributedDataParallel(model), model, optimizer
    names = {id(p): name for name, p in model.named_parameters()}
    fsdp.shard_model(model, wrap=("Block",))
    fsdp.rebind_optimizer(optimizer, names, model)
    return model, model, optimizer


def step(module: Any, optimizer: Any, batch: tuple[Any, Any], zero: bool = True) -> None:
    from torchslurm.train.tasks import token_cross_entropy

    loss = token_cross_entropy(module(batch[0]), batch[1])
    loss.backward()
    optimizer.step()
    if zero:
        optimizer.zero_grad(set_to_none=True)


def state_bytes(model: Any, optimizer: Any) -> int:
    """Bytes of parameters, gradients and optimizer state this rank holds (local shards)."""
    import torch
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    params = list(model.parameters())
    total = sum(local(p) for p in params) + sum(local(p.grad) for p in params if p.grad is not None)
    return total + sum(local(v) for s in optimizer.state.values() for v in s.values()
                       if isinstance(v, torch.Tensor))


def batches(count: int, rank: int) -> list[tuple[Any, Any]]:
    import torch

    from torchslurm.train.text import stdlib_text

    train, _ = stdlib_text(block_size=BLOCK)
    g = torch.Generator().manual_seed(rank)
    return [train[torch.randint(len(train), (BATCH,), generator=g)] for _ in range(count)]


def timing(ctx: Any, args: argparse.Namespace, out: Path) -> None:
    import torch.distributed as dist

    data = batches(args.steps, ctx.rank)
    runs = {name: build(name, args.dim, args.layers) for name in ("ddp", "fsdp")}
    ms: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.rounds):
        for name, (module, _, optimizer) in runs.items():
            dist.barrier()
            started = time.perf_counter()
            for batch in data:
                step(module, optimizer, batch)
            dist.barrier()
            if r > 0:
                ms[name].append(1000 * (time.perf_counter() - started) / len(data))
    held = {}
    for name, (module, model, optimizer) in runs.items():
        step(module, optimizer, data[0], zero=False)  # gradients present, as at the peak of a step
        held[name] = state_bytes(model, optimizer)
    if ctx.is_main:
        out.write_text(json.dumps({"ms": ms, "state_bytes": held}))


def _status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: now, VmHWM: the peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak(ctx: Any, args: argparse.Namespace, out: Path) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.fsdp  # imported here, so their code is resident before the baseline
    import torch.distributed.tensor

    data = batches(args.steps, ctx.rank)
    before = _status_kib("VmRSS")
    module, _, optimizer = build(args.only, args.dim, args.layers)
    # Building then sharding holds the whole model for a moment (no meta-device init here): reset
    # the peak after it (proc(5): clear_refs 5), so the peak is that of training.
    Path("/proc/self/clear_refs").write_text("5")
    for batch in data:
        step(module, optimizer, batch)
    grown = (_status_kib("VmHWM") - before) * 1024
    most = torch.tensor([grown], dtype=torch.int64)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    if ctx.is_main:
        out.write_text(json.dumps({"peak_rss_delta": int(most)}))


def launch(args: argparse.Namespace, out: Path, only: str = "") -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "MASTER_"))}
    subprocess.run([sys.executable, "-m", "torchslurm", "run", "--nproc", "2", __file__, "--dim", str(args.dim),
                    "--layers", str(args.layers), "--rounds", str(args.rounds), "--steps", str(args.steps),
                    "--out", str(out), *(["--only", only] if only else [])],
                   check=True, env={**env, "TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1", **MALLOC},
                   stdout=subprocess.DEVNULL)
    found: dict[str, Any] = json.loads(out.read_text())
    return found


def report(args: argparse.Namespace, timed: dict[str, Any], rss: dict[str, int]) -> None:
    ms, held = timed["ms"], timed["state_bytes"]
    med = {name: statistics.median(values) for name, values in ms.items()}
    paired = statistics.median(f / d for f, d in zip(ms["fsdp"], ms["ddp"], strict=True))
    mib = 2**20
    print(f"FSDP vs DDP: 2 Gloo ranks, GPT dim {args.dim} x {args.layers} layers, batch {BATCH}x{BLOCK} tokens/rank, "
          f"{args.rounds - 1} rounds of {args.steps} steps each")
    print(f"  {'':6s} {'ms/step':>8s} {'state MiB/rank':>15s} {'peak RSS delta MiB/rank':>24s}")
    for name in ("ddp", "fsdp"):
        print(f"  {name:6s} {med[name]:8.1f} {held[name] / mib:15.1f} {rss[name] / mib:24.1f}")
    print(f"  FSDP / DDP: step time {med['fsdp'] / med['ddp']:.2f}x (median of per-round ratios {paired:.2f}x), "
          f"state {held['fsdp'] / held['ddp']:.2f}x, peak RSS delta {rss['fsdp'] / rss['ddp']:.2f}x")
    print(json.dumps({"ms_per_step": med, "state_bytes": held, "peak_rss_delta": rss}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each strategy (the first warms up)")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps per round")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", choices=("ddp", "fsdp"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if "RANK" in os.environ:
        import torchslurm

        with torchslurm.init(backend="gloo") as ctx:
            (peak if args.only else timing)(ctx, args, args.out)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        timed = launch(args, Path(tmp) / "timing.json")
        rss = {name: launch(args, Path(tmp) / f"{name}.json", only=name)["peak_rss_delta"] for name in ("ddp", "fsdp")}
    report(args, timed, rss)
    return 0


if __name__ == "__main__":
    sys.exit(main())
