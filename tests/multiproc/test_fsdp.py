"""strategy=fsdp on real local ranks (Gloo): it trains, resumes bitwise mid-epoch, skips a corrupt
shard, saves in the background, survives kill -9 during a background save, a checkpoint of 4
ranks loads on 2 and on 3, DDP checkpoints resume under FSDP and FSDP ones under DDP, and
amp=fp16's GradScaler skips a step on every rank when one rank's gradient shard holds an inf.

This file is also the rank program: `torchslurm run --nproc N test_fsdp.py MODE OUT` runs
`worker()` on every rank, which writes its findings as JSON for the test to check.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.multiproc


def _command(nproc: int, mode: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "torchslurm", "run", "--nproc", str(nproc), __file__, mode, str(out)]


def _launch(nproc: int, mode: str, out: Path) -> dict[str, Any]:
    from tests.multiproc.conftest import clean_environ  # here: this file is also the ranks' script, run bare

    result = subprocess.run(_command(nproc, mode, out), capture_output=True, text=True, timeout=300,
                            env=clean_environ())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    data: dict[str, Any] = json.loads((out / f"{mode}.json").read_text())
    data["log"] = result.stdout + result.stderr
    return data


# ---- the rank program ---------------------------------------------------------------------------
def _trainer(ctx: Any, run_dir: Path, stop_at: int | None = None, **overrides: Any) -> Any:
    import torch

    from torchslurm.train import tasks
    from torchslurm.train.models import GPT
    from torchslurm.train.text import stdlib_text
    from torchslurm.train.trainer import TrainConfig, Trainer, seed_everything

    cfg = TrainConfig(**{"epochs": 2, "batch_size": 16, "lr": 0.003, "run_dir": run_dir, "log_every": 5,
                         "strategy": "fsdp", "checkpoint_every_epochs": 0, "grad_clip": 1.0, **overrides})
    seed_everything(0)
    model = GPT(block_size=16, dim=32, layers=2, heads=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    train, val = stdlib_text(block_size=16, max_bytes=8 << 10)
    trainer = Trainer(model, optimizer, tasks.token_cross_entropy, train, val, cfg, ctx=ctx,
                      task=tasks.language_model(model.flops_per_token()))
    if stop_at is not None:  # the preemption seam: ranks agree because global_step is the same everywhere
        trainer.should_stop = lambda: trainer.global_step == stop_at
    return trainer


def _full(trainer: Any) -> dict[str, Any]:
    """Model and optimizer state gathered whole (a collective), as CPU tensors and plain values."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model, optim = get_state_dict(trainer.model, trainer.optimizer,
                                  options=StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True))
    return {**{f"model.{k}": v for k, v in model.items()}, **{f"optim.{k}": v for k, v in optim.items()}}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def _resume_worker(ctx: Any, out: Path) -> dict[str, Any]:
    from torchslurm.train import checkpoint

    full = _trainer(ctx, out / "full")
    full_result = full.fit()
    reference = _full(full)
    stopped = _trainer(ctx, out / "mid", stop_at=7, checkpoint_every_steps=4).fit()
    mid = _trainer(ctx, out / "mid", checkpoint_every_steps=4)
    mid.fit()
    background = _trainer(ctx, out / "async", checkpoint_async=True, checkpoint_every_steps=3)
    background_result = background.fit()
    if ctx.is_main:  # a shard of the newest checkpoint cut short: resume=auto takes the one before
        shutil.copytree(out / "mid", out / "corrupt")
        newest = checkpoint.complete(out / "corrupt" / "checkpoints")[-1][1]
        shard = newest / "shards" / "tensors-00001.pt"
        shard.write_bytes(shard.read_bytes()[:100])
    ctx_barrier()
    fallback = _trainer(ctx, out / "corrupt")
    fallback.fit()
    return {
        "loss_fell": _losses(out / "full")[-1] < _losses(out / "full")[0],
        "val_perplexity": full_result.val.avg_loss,
        "stopped": [stopped.stopped_early, stopped.global_step],
        "mid_equal": _same(reference, _full(mid)),
        "async_equal": _same(reference, _full(background)),
        "async_checkpoint": str(background_result.checkpoint),
        "async_complete": [p.name for _, p in checkpoint.complete(out / "async" / "checkpoints")],
        "fallback_equal": _same(reference, _full(fallback)),
        "records": (out / "full" / "metrics.jsonl").read_text().splitlines()[-1],
    }


def _losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"kind": "step"' in line]


def _save4_worker(ctx: Any, out: Path) -> dict[str, Any]:
    import torch

    trainer = _trainer(ctx, out / "four", stop_at=5)
    result = trainer.fit()
    state = _full(trainer)
    if ctx.is_main:
        torch.save(state, out / "four-state.pt")
    return {"stopped": [result.stopped_early, result.global_step]}


def _load_worker(ctx: Any, out: Path) -> dict[str, Any]:
    import torch

    trainer = _trainer(ctx, out / "four")
    resumed = trainer.restore()
    expected = torch.load(out / "four-state.pt", weights_only=True)
    return {"resumed": resumed, "step": trainer.global_step, "equal": _same(expected, _full(trainer))}


def _switch_worker(ctx: Any, out: Path) -> dict[str, Any]:
    """A DDP checkpoint (tensors.pt) resumed under FSDP, and an FSDP one (shards/) under DDP, with
    amp=fp16's scaler (its state goes along)."""
    from torchslurm.train.strategy import make_scaler

    found = {}
    for saved, loaded in (("ddp", "fsdp"), ("fsdp", "ddp")):
        trainer = _trainer(ctx, out / saved, stop_at=5, strategy=saved)
        trainer.scaler = make_scaler("fp16", "cpu")  # the Trainer's is on CUDA: amp=fp16 refuses the CPU
        trainer.fit()
        expected = _full(trainer)
        resumed = _trainer(ctx, out / saved, strategy=loaded)
        resumed.scaler = make_scaler("fp16", "cpu")
        found[f"{saved} to {loaded}"] = {
            "resumed": [resumed.restore(), resumed.global_step], "equal": _same(expected, _full(resumed)),
            "scaler": [trainer.scaler.state_dict(), resumed.scaler.state_dict()],
            "files": sorted(str(p.relative_to(trainer.checkpointer.last)) for p in trainer.checkpointer.last.rglob("*")
                            if p.is_file()) if ctx.is_main else []}
    return found


def _async_kill_worker(ctx: Any, out: Path) -> dict[str, Any]:
    """Checkpoints every step in the background, for the test to kill -9 while one is written."""
    _trainer(ctx, out / "killed", epochs=50, checkpoint_async=True, checkpoint_every_steps=1).fit()
    return {}


def _fp16_worker(ctx: Any, out: Path) -> dict[str, Any]:
    """amp=fp16's GradScaler under FSDP with an inf in rank 1's gradient shard only, through the
    Trainer's own micro-step and optimizer step (unscaled by step(), or by unscale_ before clipping);
    then a normal step, a checkpoint of the scaler and its resume; then the fp16 policy's dtypes."""
    import torch.distributed as dist

    from torchslurm.train.strategy import make_scaler

    mine: dict[str, Any] = {}
    for clip in (0.0, 1.0):
        trainer = _trainer(ctx, out / f"clip-{clip}", grad_clip=clip)
        trainer.scaler = make_scaler("fp16", "cpu")  # the Trainer's is on CUDA: amp=fp16 refuses the CPU
        batches = iter(trainer._train_loader())
        mine[f"clip {clip}"] = [_scaled_step(trainer, next(batches), inf=ctx.rank == 1),
                                _scaled_step(trainer, next(batches), inf=False)]
    trainer.save()
    resumed = _trainer(ctx, out / f"clip-{clip}")
    resumed.scaler = make_scaler("fp16", "cpu")
    resumed.restore()
    mine["scaler"] = [trainer.scaler.state_dict(), resumed.scaler.state_dict()]
    mine["fp16 policy"] = _fp16_policy_dtypes()
    mine["encoder"] = _encoder_units()
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, mine)
    return {"ranks": gathered}


def _scaled_step(trainer: Any, batch: Any, inf: bool) -> dict[str, Any]:
    """One micro-step and optimizer step of `trainer`, with an inf in this rank's first gradient shard
    when `inf`: did the parameters change, and the scale after the step."""
    import torch

    trainer._micro_step(batch, 1, True)
    if inf:
        grad = next(p.grad.to_local() for p in trainer.model.parameters() if p.grad.to_local().numel())
        grad.view(-1)[0] = float("inf")
    before = [p.detach().to_local().clone() for p in trainer.model.parameters()]
    trainer._optimizer_step()
    after = [p.detach().to_local() for p in trainer.model.parameters()]
    return {"changed": not all(torch.equal(a, b) for a, b in zip(before, after, strict=True)),
            "scale": trainer.scaler.get_scale()}


def _fp16_policy_dtypes() -> list[str]:
    """amp=fp16's FSDP policy: fp16 logits in forward, fp32 DTensor gradient shards (GradScaler refuses
    fp16 gradients), one scaled step."""
    import torch

    from torchslurm.train import fsdp, tasks
    from torchslurm.train.models import GPT
    from torchslurm.train.strategy import make_scaler

    model = fsdp.shard_model(GPT(block_size=16, dim=32, layers=2, heads=2), amp="fp16")
    optimizer, scaler = torch.optim.AdamW(model.parameters()), make_scaler("fp16", "cpu")
    tokens = torch.randint(0, 256, (4, 17), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.float16):
        logits = model(tokens[:, :-1])
    scaler.scale(tasks.token_cross_entropy(logits, tokens[:, 1:])).backward()
    grads = {f"{type(p.grad).__name__} {p.grad.dtype}" for p in model.parameters()}
    scaler.step(optimizer)
    scaler.update()
    return [str(logits.dtype), *sorted(grads), f"scale {scaler.get_scale()}"]


def _encoder_units() -> dict[str, Any]:
    """torch's nn.TransformerEncoder sharded without fsdp_wrap: is each layer an FSDP unit of its own,
    and what did this rank log (the summary: rank 0 alone)."""
    import logging

    import torch
    from torch import nn
    from torch.distributed.fsdp import FSDPModule

    from torchslurm.train import fsdp

    said: list[str] = []
    keep = logging.Handler()
    keep.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("torchslurm.train.fsdp")
    log.addHandler(keep)
    log.setLevel(logging.INFO)
    try:
        layer = nn.TransformerEncoderLayer(32, 2, 64, batch_first=True)
        model = nn.Sequential(nn.Embedding(64, 32), nn.TransformerEncoder(layer, 3, enable_nested_tensor=False),
                              nn.Linear(32, 64))
        fsdp.shard_model(model)
        model(torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))).sum().backward()
    finally:
        log.removeHandler(keep)
    return {"layers sharded": [isinstance(m, FSDPModule) for m in model[1].layers], "said": said}


def ctx_barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def worker() -> None:
    import torchslurm

    mode, out = sys.argv[1], Path(sys.argv[2])
    work = {"resume": _resume_worker, "save4": _save4_worker, "load": _load_worker,
            "kill": _async_kill_worker, "fp16": _fp16_worker, "switch": _switch_worker}[mode]
    with torchslurm.init() as ctx:
        result = work(ctx, out)
        if ctx.is_main:
            (out / f"{mode}.json").write_text(json.dumps(result))


# ---- the tests ----------------------------------------------------------------------------------
@pytest.mark.parametrize("nproc", [2, 3])
def test_fsdp_trains_resumes_bitwise_and_saves_in_the_background(tmp_path: Path, nproc: int) -> None:
    r = _launch(nproc, "resume", tmp_path)
    assert r["loss_fell"], r["log"][-3000:]
    assert r["stopped"] == [True, 7]
    assert r["mid_equal"], "resumed mid-epoch under FSDP differs from the uninterrupted run"
    assert r["async_equal"], "background checkpoints changed the training"
    assert r["async_complete"][-1] == Path(r["async_checkpoint"]).name  # the last one was waited for
    assert r["fallback_equal"]
    assert "skipping corrupt checkpoint" in r["log"] and "tensors-00001.pt" in r["log"]
    record = json.loads(r["records"])
    assert {"val_perplexity", "tokens_per_s", "flops_per_s"} <= record.keys()


def test_checkpoint_of_four_ranks_loads_on_two_and_three(tmp_path: Path) -> None:
    assert _launch(4, "save4", tmp_path)["stopped"] == [True, 5]
    for nproc in (2, 3):
        r = _launch(nproc, "load", tmp_path)
        assert (r["resumed"], r["step"], r["equal"]) == (True, 5, True), nproc
        assert f"world_size was 4, now {nproc}, so data order and RNG streams differ" in r["log"]


def test_a_ddp_checkpoint_resumes_under_fsdp_and_an_fsdp_one_under_ddp(tmp_path: Path) -> None:
    r = _launch(2, "switch", tmp_path)
    for case, expected_files in (("ddp to fsdp", {"tensors.pt"}),
                                 ("fsdp to ddp", {"shards/tensors-00000.pt", "shards/tensors-00001.pt"})):
        assert r[case]["resumed"] == [True, 5], case
        assert r[case]["equal"], f"{case}: model or optimizer state differs after the resume"
        assert expected_files <= set(r[case]["files"]), r[case]["files"]
        saved, resumed = r[case]["scaler"]  # 5 steps without an inf: growth counted, the scale unchanged
        assert saved == resumed and (resumed["scale"], resumed["_growth_tracker"]) == (2.0 ** 16, 5), case


def test_kill_9_during_a_background_save_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    from tests.multiproc.conftest import clean_environ

    from torchslurm.train import checkpoint

    proc = subprocess.Popen(_command(2, "kill", tmp_path), env=clean_environ(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = tmp_path / "killed" / "checkpoints"
    deadline = time.monotonic() + 240
    try:  # kill once a checkpoint is complete and the next one is being written
        while time.monotonic() < deadline and not (checkpoint.complete(root) and any(root.glob(".staging-*"))):
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    found = checkpoint.load_latest(root)
    assert found is not None, "no complete checkpoint before the kill"
    assert found[1]["format"] == 2 and found[1]["global_step"] >= 1


def test_fp16_scaler_skips_a_step_on_every_rank_when_one_rank_s_shard_has_an_inf(tmp_path: Path) -> None:
    ranks = _launch(2, "fp16", tmp_path)["ranks"]
    for clip in ("clip 0.0", "clip 1.0"):
        skipped, normal = zip(*(rank[clip] for rank in ranks), strict=True)
        assert skipped == ({"changed": False, "scale": 2.0 ** 15},) * 2, (clip, skipped)  # halved everywhere
        assert normal == ({"changed": True, "scale": 2.0 ** 15},) * 2, (clip, normal)
    # the halved scale and the growth tracker's one step since survive the checkpoint, on every rank
    for rank in ranks:
        saved, resumed = rank["scaler"]
        assert saved == resumed, (saved, resumed)
        assert (resumed["scale"], resumed["_growth_tracker"]) == (2.0 ** 15, 1), resumed
    assert ranks[0]["fp16 policy"] == ranks[1]["fp16 policy"] == [
        "torch.float16", "DTensor torch.float32", "scale 65536.0"]
    # without fsdp_wrap an nn.TransformerEncoder is sharded per layer, and that is said once, by rank 0
    assert [rank["encoder"]["layers sharded"] for rank in ranks] == [[True] * 3] * 2
    assert [rank["encoder"]["said"] for rank in ranks] == [
        ["FSDP: 3 sharded units + root over 2 ranks (TransformerEncoderLayer)"], []]


if __name__ == "__main__":
    worker()
