"""Trainer options on one process (no process group): AMP, clipping, schedulers, lr scaling, errors."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from torchslurm.errors import ConfigError
from torchslurm.train import data
from torchslurm.train.config import TrainConfig
from torchslurm.train.models import SimpleConvNet
from torchslurm.train.trainer import Trainer, seed_everything

pytestmark = pytest.mark.multiproc


def _trainer(run_dir: Path, scheduler: Any = None, subset: int = 0, **overrides: Any) -> Trainer:
    cfg = TrainConfig(**{"epochs": 1, "batch_size": 64, "lr": 0.05, "run_dir": run_dir, "log_every": 0,
                         **overrides})
    seed_everything(cfg.seed)
    model = SimpleConvNet(8)
    train, val = data.digits()
    if subset:  # fewer samples where only the mechanics matter
        train, val = torch.utils.data.Subset(train, range(subset)), torch.utils.data.Subset(val, range(subset // 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    return Trainer(model, optimizer, torch.nn.functional.cross_entropy, train, val, cfg, scheduler=scheduler)


def test_bf16_autocast_on_cpu_trains(tmp_path: Path) -> None:
    result = _trainer(tmp_path, amp="bf16", grad_clip=1.0, batch_size=32).fit()
    assert result.val is not None and math.isfinite(result.val.avg_loss) and result.val.accuracy > 0.5


def test_fp16_needs_cuda(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"amp=fp16 needs CUDA \(fp16 with a GradScaler\), but the ranks run on "
                                          r"cpu \(no GPU visible here\)\. HINT: use amp=bf16 on CPU"):
        _trainer(tmp_path, amp="fp16")


def test_scheduler_state_survives_a_resume(tmp_path: Path) -> None:
    def step_lr(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        return torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)

    full = _trainer(tmp_path / "full", step_lr, subset=640, epochs=2)  # 10 steps per epoch
    full.fit()
    _trainer(tmp_path / "split", step_lr, subset=640, epochs=1).fit()
    resumed = _trainer(tmp_path / "split", step_lr, subset=640, epochs=2)
    resumed.fit()
    assert resumed.optimizer.param_groups[0]["lr"] == full.optimizer.param_groups[0]["lr"] == 0.05 * 0.5 ** 2
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_lr_scaling_is_a_function_of_world_size(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, lr_scaling="sqrt")
    assert trainer.lr_factor == 1.0 and trainer.optimizer.param_groups[0]["lr"] == 0.05  # one process


def test_resume_from_a_missing_path_says_so_when_the_trainer_is_built(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"resume='.*nowhere': no such folder; expected auto, never or a checkpoint "
                                          r"folder.*HINT: resume=auto continues"):
        _trainer(tmp_path, resume=str(tmp_path / "nowhere"))


def test_explicit_resume_path_and_step_checkpoints(tmp_path: Path) -> None:
    _trainer(tmp_path / "a", checkpoint_every_steps=5, keep_last=3).fit()  # 23 steps: 5, 10, 15, 20 + 23
    steps = sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir())
    assert steps == ["step-000000015", "step-000000020", "step-000000023"]
    trainer = _trainer(tmp_path / "b", resume=str(tmp_path / "a" / "checkpoints" / "step-000000015"))
    trainer.should_stop = lambda: True  # stop at the first boundary after resuming
    result = trainer.fit()
    assert result.stopped_early and (result.global_step, trainer.batches_done) == (16, 16)

