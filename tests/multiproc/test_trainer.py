"""The Trainer on real local ranks (Gloo), started by `torchslurm run`.

This file is also the rank program: `torchslurm run --nproc N test_trainer.py MODE OUT` runs
`worker()` on every rank, which writes its findings as JSON for the test to check.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.multiproc


def _launch(nproc: int, mode: str, out: Path) -> dict[str, Any]:
    from tests.multiproc.conftest import clean_environ  # here: this file is also the ranks' script, run bare

    result = subprocess.run([sys.executable, "-m", "torchslurm", "run", "--nproc", str(nproc), __file__, mode,
                             str(out)], capture_output=True, text=True, timeout=300, env=clean_environ())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    data: dict[str, Any] = json.loads((out / "result.json").read_text())
    data["log"] = result.stderr
    return data


# ---- the rank program ---------------------------------------------------------------------------
def _parts(run_dir: Path, seed: int = 0, **overrides: Any) -> tuple[Any, ...]:
    import torch

    from torchslurm.train import data
    from torchslurm.train.models import SimpleConvNet
    from torchslurm.train.trainer import TrainConfig, seed_everything

    cfg = TrainConfig(**{"epochs": 3, "batch_size": 32, "lr": 0.05, "run_dir": run_dir, "log_every": 10,
                         "seed": seed, **overrides})
    seed_everything(cfg.seed)
    model = SimpleConvNet(8)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    train, val = data.digits()
    return model, optimizer, torch.nn.functional.cross_entropy, train, val, cfg


def _fit(ctx: Any, run_dir: Path, stop_at: int | None = None, overlap_min_bytes: int | None = None,
         **overrides: Any) -> tuple[Any, Any]:
    from torchslurm.train.trainer import Trainer

    model, optimizer, loss_fn, train, val, cfg = _parts(run_dir, **overrides)
    trainer = Trainer(model, optimizer, loss_fn, train, val, cfg, ctx=ctx)
    if overlap_min_bytes is not None:
        trainer.checkpointer.overlap_min_bytes = overlap_min_bytes
    if stop_at is not None:  # the preemption seam: ranks agree because global_step is the same everywhere
        trainer.should_stop = lambda: trainer.global_step == stop_at
    return trainer, trainer.fit()


def _same(a: Any, b: Any) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] if r["kind"] == "step" else r["val_loss"] for r in records]


def _epoch_metrics(run_dir: Path) -> list[tuple[float, ...]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = ("epoch", "step", "train_loss", "train_accuracy", "val_loss", "val_accuracy")
    return [tuple(r[k] for k in keys) for r in records if r["kind"] == "epoch"]


def _resume_worker(ctx: Any, out: Path) -> dict[str, Any]:
    """Uninterrupted vs stopped-after-epoch-2, vs corrupt-newest fallback, vs stopped mid-epoch."""
    full, full_result = _fit(ctx, out / "full")
    again, _ = _fit(ctx, out / "again")
    _fit(ctx, out / "epoch2", epochs=2)
    if ctx.is_main:
        shutil.copytree(out / "epoch2", out / "corrupt")
        newest = sorted((out / "corrupt" / "checkpoints").iterdir())[-1] / "state.pt"
        newest.write_bytes(newest.read_bytes()[:1000])
    ctx_barrier()
    resumed, resumed_result = _fit(ctx, out / "epoch2")
    fallback, _ = _fit(ctx, out / "corrupt")
    _, stopped = _fit(ctx, out / "mid", stop_at=30, checkpoint_every_epochs=0)
    stopped_outcome = (out / "mid" / "outcome.json").read_text() if ctx.is_main else ""
    mid, _ = _fit(ctx, out / "mid", checkpoint_every_epochs=0)
    _, stopped_accum = _fit(ctx, out / "accum", stop_at=13, grad_accum_steps=2)
    accum_mid, _ = _fit(ctx, out / "accum", grad_accum_steps=2)
    accum_full, _ = _fit(ctx, out / "accum_full", grad_accum_steps=2)
    weights = full.model.state_dict()
    return {
        "same_seed_same_losses": _losses(out / "full") == _losses(out / "again"),
        "same_seed_same_weights": _same(weights, again.model.state_dict()),
        "resume_epoch2_equal": _same(weights, resumed.model.state_dict()),
        "resume_started_at_epoch": resumed_result.epochs_done,
        "fallback_equal": _same(weights, fallback.model.state_dict()),
        "stopped": [stopped.stopped_early, stopped.global_step, stopped.epochs_done],
        "mid_epoch_equal": _same(weights, mid.model.state_dict()),
        "mid_epoch_metrics_equal": _epoch_metrics(out / "full") == _epoch_metrics(out / "mid"),
        "accum_stopped": [stopped_accum.stopped_early, stopped_accum.global_step],
        "accum_mid_equal": _same(accum_full.model.state_dict(), accum_mid.model.state_dict()),
        "accum_differs_from_plain": not _same(weights, accum_full.model.state_dict()),
        "final_accuracy": full_result.val.accuracy,
        "metrics_epochs": [json.loads(line)["epoch"] for line in (out / "mid" / "metrics.jsonl").read_text()
                           .splitlines() if '"kind": "epoch"' in line],
        "outcomes": {"stopped": json.loads(stopped_outcome) if stopped_outcome else None,
                     "raised": _raise_at(ctx, out / "failed", 5)},
    }


def _raise_at(ctx: Any, run_dir: Path, step: int) -> bool:
    """A fit whose should_stop raises on every rank at `step`: each rank writes outcome.json `failed`."""
    from torchslurm.train.trainer import Trainer

    model, optimizer, loss_fn, train, val, cfg = _parts(run_dir, epochs=1)
    trainer = Trainer(model, optimizer, loss_fn, train, val, cfg, ctx=ctx)

    def boom() -> bool:
        if trainer.global_step == step:
            raise ValueError(f"injected at step {step}\nnot this line")
        return False

    trainer.should_stop = boom
    try:
        trainer.fit()
    except ValueError:
        return True
    return False


def _beside_worker(ctx: Any, out: Path) -> dict[str, Any]:
    """Epoch-end checkpoints written beside validation (any size: the threshold at 0) against ones
    written first on the training thread: the same weights, metrics and resume."""
    first, _ = _fit(ctx, out / "first")
    beside, _ = _fit(ctx, out / "beside", overlap_min_bytes=0)
    _fit(ctx, out / "resumed", epochs=2)
    resumed, _ = _fit(ctx, out / "resumed")
    background, _ = _fit(ctx, out / "async", checkpoint_async=True)
    weights = first.model.state_dict()
    return {
        "beside_equal": _same(weights, beside.model.state_dict()),
        "beside_metrics_equal": _epoch_metrics(out / "first") == _epoch_metrics(out / "beside"),
        "beside_resumed_equal": _same(weights, resumed.model.state_dict()),
        "async_equal": _same(weights, background.model.state_dict()),
        "beside_written": beside.checkpointer.written,
        "checkpoints": {name: [p.name for p in sorted((out / name / "checkpoints").iterdir())]
                        for name in ("first", "beside", "resumed", "async")},
    }


def _metrics_worker(ctx: Any, out: Path) -> dict[str, Any]:
    import torch

    model, optimizer, loss_fn, train, val, cfg = _parts(out / "metrics")
    model.load_state_dict(torch.load(out / "weights.pt", weights_only=True))
    from torchslurm.train.trainer import Trainer

    totals = Trainer(model, optimizer, loss_fn, train, val, cfg, ctx=ctx).evaluate()
    return {"loss_sum": totals.loss_sum, "correct": totals.correct, "count": totals.count}


def ctx_barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def worker() -> None:
    import torchslurm

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    mode, out = sys.argv[1], Path(sys.argv[2])
    with torchslurm.init() as ctx:
        result = {"resume": _resume_worker, "metrics": _metrics_worker, "beside": _beside_worker}[mode](ctx, out)
        if ctx.is_main:
            (out / "result.json").write_text(json.dumps(result))


# ---- the tests ------------------------------------------------------------------------------------
def test_resume_fallback_and_determinism_with_two_ranks(tmp_path: Path) -> None:
    r = _launch(2, "resume", tmp_path)
    assert r["same_seed_same_losses"] and r["same_seed_same_weights"]
    assert r["resume_epoch2_equal"], "resumed after epoch 2 must equal the uninterrupted run bitwise"
    assert "Resuming from" in r["log"] and "epoch 3, batch 0" in r["log"]
    assert r["fallback_equal"], "fallback to the epoch-1 checkpoint must still reach the same weights"
    assert "skipping corrupt checkpoint" in r["log"] and "corrupt/checkpoints/step-000000046" in r["log"]
    assert r["stopped"] == [True, 30, 1]  # 23 steps per epoch with 2 ranks × 32: stopped in epoch 2
    assert r["mid_epoch_equal"], "resume from a mid-epoch checkpoint must be bitwise identical"
    assert r["mid_epoch_metrics_equal"], "and its epoch metrics (train sums restored) the same"
    assert r["accum_stopped"] == [True, 13] and r["accum_mid_equal"] and r["accum_differs_from_plain"]
    assert r["metrics_epochs"] == [1, 2, 3]  # the resumed run's log has each epoch once
    # outcome.json: rank 0 says how each fit ended; a rank whose fit raised says failed, with the error's first line
    completed = json.loads((tmp_path / "full" / "outcome.json").read_text())
    assert {k: completed[k] for k in ("state", "epochs_done", "step", "error", "rank", "requeued")} == {
        "state": "completed", "epochs_done": 3, "step": 69, "error": None, "rank": 0, "requeued": False}
    assert completed["wall_s"] > 0
    assert {k: r["outcomes"]["stopped"][k] for k in ("state", "epochs_done", "step", "requeued")} == {
        "state": "stopped", "epochs_done": 1, "step": 30, "requeued": False}
    assert json.loads((tmp_path / "mid" / "outcome.json").read_text())["state"] == "completed"  # the resumed fit
    failed = json.loads((tmp_path / "failed" / "outcome.json").read_text())
    assert r["outcomes"]["raised"] and failed["rank"] in (0, 1)
    assert (failed["state"], failed["error"], failed["step"]) == ("failed", "ValueError: injected at step 5", 5)
    marker = json.loads((tmp_path / "full" / "checkpoints" / "step-000000069" / "COMPLETE").read_text())
    assert sorted(marker["files"]) == ["rank-00000.pt", "rank-00001.pt", "state.pt", "tensors.pt"]  # every rank's
    assert r["final_accuracy"] >= 0.9
    assert "Starting distributed training on 2 processes (1 node × 2, gloo, cpu), master" in r["log"]
    assert "Epoch 3 - Avg Loss: " in r["log"]
    assert (tmp_path / "full" / "curves.png").stat().st_size > 10_000
    events = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    board = events.EventAccumulator(str(tmp_path / "full" / "tensorboard"))
    board.Reload()
    assert [e.step for e in board.Scalars("epoch/val_accuracy")] == [23, 46, 69]  # rank 0 wrote each epoch once


def test_epoch_checkpoints_written_beside_validation_change_nothing(tmp_path: Path) -> None:
    r = _launch(2, "beside", tmp_path)
    assert r["beside_equal"] and r["beside_metrics_equal"], "a checkpoint written beside validation changed training"
    assert r["beside_resumed_equal"], "resuming from a checkpoint written beside validation must be bitwise"
    assert r["async_equal"]
    assert r["beside_written"] == ["beside"] * 3  # each epoch's save went beside validation
    steps = ["step-000000046", "step-000000069"]  # keep_last=2 of 23, 46, 69
    assert r["checkpoints"] == {"first": steps, "beside": steps, "resumed": steps, "async": steps}
    log = r["log"]
    for epoch, step in ((1, 23), (2, 46), (3, 69)):  # each epoch's line comes before its checkpoint's
        assert log.index(f"Epoch {epoch} - ") < log.index(f"step-{step:09d} (after epoch {epoch}, step {step})")


def test_resume_with_changed_batch_size_restarts_the_epoch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from torchslurm.train.trainer import Trainer

    model, optimizer, loss_fn, train, val, cfg = _parts(tmp_path, epochs=2, checkpoint_every_steps=10,
                                                        batch_size=64, log_every=0)
    trainer = Trainer(model, optimizer, loss_fn, train, val, cfg)
    trainer.should_stop = lambda: trainer.global_step == 30  # mid-epoch 2 (23 steps per epoch)
    assert trainer.fit().stopped_early
    model, optimizer, loss_fn, train, val, cfg = _parts(tmp_path, epochs=2, batch_size=32, log_every=0)
    with caplog.at_level(logging.INFO, logger="torchslurm"):
        result = Trainer(model, optimizer, loss_fn, train, val, cfg).fit()
    assert "batch_size was 64, now 32, so data order and RNG streams differ" in caplog.text
    assert "restarting the interrupted epoch" in caplog.text and "Resuming from" in caplog.text
    assert result.epochs_done == 2 and not result.stopped_early and result.global_step == 30 + 45


@pytest.mark.parametrize("nproc", [2, 3])
def test_validation_metrics_equal_one_process(tmp_path: Path, nproc: int) -> None:
    import torch

    from torchslurm.train.trainer import Trainer

    model, optimizer, loss_fn, train, val, cfg = _parts(tmp_path / "single", epochs=1, log_every=0)
    assert len(val) % nproc != 0, "the point: DistributedSampler would pad this dataset"
    Trainer(model, optimizer, loss_fn, train, val, cfg).fit()  # one process, no process group
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    single = Trainer(model, optimizer, loss_fn, train, val, cfg).evaluate()
    r = _launch(nproc, "metrics", tmp_path)
    assert (r["correct"], r["count"]) == (single.correct, single.count) == (r["correct"], len(val))
    assert r["loss_sum"] == pytest.approx(single.loss_sum, rel=1e-6)  # float sums in another order


if __name__ == "__main__":
    worker()
