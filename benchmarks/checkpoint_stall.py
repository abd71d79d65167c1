"""Checkpoint stall: the training time one checkpoint takes away, per way of saving.

The same state (a GPT's model and AdamW state, `--dim`/`--layers` set its size) saved by:
- bare: `torch.save` of model and optimizer state into one file, nothing else (the yardstick);
- rank-0 single file: torchslurm's first format, as the test helper `write_format1` writes it (torch.save +
  sha256 + fsync + rename);
- sync: the Trainer's save on the training thread, `checkpoint.writer.Writer.save` (format 2: tensors.pt,
  rank files, checksums, COMPLETE, rename), as under DDP or in one process; its fsyncs follow on a
  thread (the time until they are done is reported too: neither bare nor the peers' torch.save
  fsync at all);
- sync, FSDP shards: the same save of the same state sharded by FSDP2 (`fully_shard` over a
  process group of this one rank): each rank's parts in one torch.save (`checkpoint.shards`);
- async: the stall only — state dicts, the copy to CPU memory and starting the background
  writer; the write itself overlaps the next steps (its full time is reported too).
Each is repeated `--rounds` times after `--warmup` untimed rounds, alternating, on the same
filesystem, each starting with no dirty pages (os.sync() and the previous files deleted, outside
the timing); the median is reported with the ratios against bare. keep_last=1: the older
checkpoint is renamed away in the save and deleted in the background. One process (the FSDP way
in a process group of this one rank, over loopback): the per-rank cost.

    python benchmarks/checkpoint_stall.py [--dim 512] [--layers 8] [--rounds 5] [--warmup 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from torchslurm.runtime.ports import find_free_port
from torchslurm.train import fsdp
from torchslurm.train.checkpoint.layout import FORMAT, Pruner
from torchslurm.train.checkpoint.state import split_state
from torchslurm.train.checkpoint.writer import Snapshot, Writer
from torchslurm.train.models import GPT
from torchslurm.train.rng import rng_state

_FORMAT1 = Path(__file__).parents[1] / "tests" / "unit" / "train" / "checkpoint" / "format1.py"


def _format1_writer() -> Callable[..., Path]:
    """The first format's writer, kept as a test helper (the Trainer writes format 2)."""
    spec = importlib.util.spec_from_file_location("format1", _FORMAT1)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_format1  # type: ignore[no-any-return]


def trained_gpt(dim: int, layers: int, shard: bool = False) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The GPT after one AdamW step (its moments exist), sharded by FSDP2 over a 1-rank group if asked."""
    torch.manual_seed(0)
    model = GPT(dim=dim, layers=layers, heads=8)
    names = {id(p): name for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if shard:
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
        fsdp.shard_model(model)
        fsdp.rebind_optimizer(optimizer, names, model)
    model(torch.zeros(2, 64, dtype=torch.long)).sum().backward()
    optimizer.step()
    return model, optimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed rounds first: right after a large delete or free, the first page-cache "
                             "writes of a process run up to 3x slower, whichever way saves")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    model, optimizer = trained_gpt(args.dim, args.layers)
    sharded, sharded_optimizer = trained_gpt(args.dim, args.layers, shard=True)
    root = Path(tempfile.mkdtemp(prefix="stall-", dir=args.dir))
    writer = Writer()
    pruner = Pruner()
    write_format1 = _format1_writer()
    background: list[float] = []
    durable: list[float] = []

    def bare(step: int) -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, root / f"bare-{step}.pt")

    def single_file(step: int) -> None:
        state = {"format": 1, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
        write_format1(root / "single", step, state, keep_last=1, pruner=pruner)

    def snapshot(step: int, way: str, staged: bool = False) -> Snapshot:
        tensors, plain = split_state(*((sharded, sharded_optimizer) if way == "fsdp" else (model, optimizer)))
        return Snapshot(root / way, step, writer.stage(tensors) if staged else tensors,
                        {"rng": rng_state()}, {"format": FORMAT, "optim_plain": plain}, 1)

    def sync(step: int) -> None:
        writer.save(snapshot(step, "sync"))

    def sync_sharded(step: int) -> None:
        writer.save(snapshot(step, "fsdp"))

    def background_save(step: int) -> None:
        writer.start(snapshot(step, "async", staged=True))

    ways: dict[str, Callable[[int], None]] = {"bare torch.save": bare, "rank-0 single file": single_file,
                                               "sync": sync, "sync, FSDP shards": sync_sharded,
                                               "async (stall)": background_save}
    times: dict[str, list[float]] = {name: [] for name in ways}
    def settle() -> None:
        """Outside the timing: the previous way's files deleted (keep_last=1 deletes in the background)
        and every dirty page on disk, so that no way pays for the write-back of another's bytes."""
        for old in root.glob("bare-*.pt"):
            old.unlink()
        writer.close()
        pruner.wait()
        os.sync()

    for step in range(1, args.warmup + args.rounds + 1):
        timed = step > args.warmup
        for name, save in ways.items():
            settle()
            started = time.perf_counter()
            save(step)
            if timed:
                times[name].append(time.perf_counter() - started)
            if name in ("sync", "async (stall)"):
                writer.wait()
                if timed:
                    (background if "async" in name else durable).append(time.perf_counter() - started)
            writer.wait()
    shutil.rmtree(root)
    dist.destroy_process_group()
    size = sum(p.numel() * p.element_size() for p in model.parameters()) * 3  # weights + 2 AdamW moments
    base = statistics.median(times["bare torch.save"])
    rows = {name: statistics.median(t) for name, t in times.items()}
    print(f"state {size / 2**20:.0f} MiB, {args.rounds} rounds, median per checkpoint:")
    for name, t in rows.items():
        print(f"  {name:22s} {t * 1000:8.1f} ms   {t / base:5.2f}x bare")
    print(f"  {'sync (on disk)':22s} {statistics.median(durable) * 1000:8.1f} ms   (fsyncs on a thread)")
    print(f"  {'async (whole)':22s} {statistics.median(background) * 1000:8.1f} ms   (in the background)")
    print(json.dumps({"state_mib": size / 2**20, **{k: v * 1000 for k, v in rows.items()}}))


if __name__ == "__main__":
    main()
