"""`torchslurm train`: the README's demo command, end to end on 2 local Gloo ranks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchslurm import checkpoint

pytestmark = pytest.mark.multiproc


def _train(*overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    result = subprocess.run([sys.executable, "-m", "torchslurm", "train", "--nproc", "2", *overrides],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    _step, path = checkpoint.complete(run_dir / "checkpoints")[-1]
    model: dict[str, torch.Tensor] = checkpoint.load(path)["model"]
    return model


def test_demo_reaches_90_percent_and_resume_after_epoch_2_matches(tmp_path: Path) -> None:
    full = _train(f"run_dir={tmp_path / 'full'}")
    assert re.search(r"Starting distributed training on 2 processes \(1 node × 2, gloo, cpu\), "
                     r"master localhost:\d+", full.stdout)
    accuracies = [float(a) for a in re.findall(r"Epoch \d - Avg Loss: \d+\.\d{6}, Accuracy: (\d+\.\d\d)%", full.stdout)]
    assert len(accuracies) == 4 and accuracies[-1] >= 90.0
    for name in ("metrics.jsonl", "curves.png"):
        assert (tmp_path / "full" / name).stat().st_size > 0
    assert f"plot         {tmp_path / 'full' / 'curves.png'}" in full.stdout

    first = _train(f"run_dir={tmp_path / 'split'}", "epochs=2")
    assert "Epoch 3" not in first.stdout
    second = _train(f"run_dir={tmp_path / 'split'}")
    assert "Resuming from" in second.stdout and "epoch 3, batch 0, step 46" in second.stdout
    assert "Epoch 1 " not in second.stdout and "Epoch 4 - Avg Loss" in second.stdout
    a, b = _final_model(tmp_path / "full"), _final_model(tmp_path / "split")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    epochs = [json.loads(line)["epoch"] for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()
              if '"kind": "epoch"' in line]
    assert epochs == [1, 2, 3, 4]


def test_bad_setting_fails_before_starting_ranks(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "torchslurm", "train", "lr_scaling=cubic"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "error: lr_scaling='cubic' is not one of none | linear | sqrt. HINT: lr_scaling=none" in result.stderr
    assert "Starting" not in result.stdout
