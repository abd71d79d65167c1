"""`torchslurm train`: the README's demo command, end to end on 2 local Gloo ranks."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tests.multiproc.conftest import clean_environ

from torchslurm.train import checkpoint

pytestmark = pytest.mark.multiproc

EVERY_STEP = {"TORCHSLURM_CHECK_PERIOD_S": "0"}  # stop within a step: the demo's 92 steps take 0.5 s




def _train(*overrides: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "torchslurm", "train", "--nproc", "2", *overrides],
                            capture_output=True, text=True, timeout=300, env=clean_environ(**EVERY_STEP))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _preempted(run_dir: Path) -> tuple[int, str]:
    """`torchslurm train` sent SIGUSR2 (Slurm's warning signal) once the first step is logged."""
    proc = subprocess.Popen([sys.executable, "-m", "torchslurm", "train", "--nproc", "2", f"run_dir={run_dir}",
                             "log_every=1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=clean_environ(**EVERY_STEP))
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and '"kind": "step"' in metrics.read_text():
            proc.send_signal(signal.SIGUSR2)
            break
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=240)
    return proc.returncode, out


def _final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    _step, path = checkpoint.complete(run_dir / "checkpoints")[-1]
    return checkpoint.read_model(path)


def test_demo_reaches_90_percent_and_resumes_bitwise_after_preemption(tmp_path: Path) -> None:
    full = _train(f"run_dir={tmp_path / 'full'}")
    assert re.search(r"Starting distributed training on 2 processes \(1 node × 2, gloo, cpu\), "
                     r"master localhost:\d+", full.stdout)
    accuracies = [float(a) for a in re.findall(r"Epoch \d - Avg Loss: \d+\.\d{6}, Accuracy: (\d+\.\d\d)%", full.stdout)]
    assert len(accuracies) == 4 and accuracies[-1] >= 90.0
    for name in ("metrics.jsonl", "curves.png"):
        assert (tmp_path / "full" / name).stat().st_size > 0
    assert f"plot         {tmp_path / 'full' / 'curves.png'}" in full.stdout
    assert f"tensorboard  {tmp_path / 'full' / 'tensorboard'}" in full.stdout
    assert any((tmp_path / "full" / "tensorboard").glob("events.out.tfevents.*"))

    # Preempted mid-epoch (the signal reaches the ranks through the launcher): checkpoint, exit 75;
    # the same command then resumes inside the epoch and ends with the same weights.
    code, out = _preempted(tmp_path / "preempted")
    assert code == 75, out[-3000:]
    assert "stopping early at epoch" in out
    resumed = _train(f"run_dir={tmp_path / 'preempted'}")
    # usually inside an epoch (batch > 0); at an epoch's last step (1 in 92) the next one starts at batch 0
    assert re.search(r"Resuming from .*: epoch \d, batch \d+, step [1-9]", resumed.stdout)
    assert "Epoch 4 - Avg Loss" in resumed.stdout
    a, b = _final_model(tmp_path / "full"), _final_model(tmp_path / "preempted")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    epochs = [json.loads(line)["epoch"] for line in (tmp_path / "preempted" / "metrics.jsonl").read_text()
              .splitlines() if '"kind": "epoch"' in line]
    assert epochs == [1, 2, 3, 4]


def test_bad_setting_fails_before_starting_ranks(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "torchslurm", "train", "lr_scaling=cubic"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == ("error: lr_scaling='cubic' is not one of none, linear, sqrt. "
                             "HINT: set lr_scaling to one of: none, linear, sqrt.\n")
    assert "Starting" not in result.stdout


def test_dry_run_passes_config_flags_and_settings_to_the_ranks(tmp_path: Path) -> None:
    (tmp_path / "cfg.yaml").write_text("epochs: 7\ndataset: synthetic\n")
    result = subprocess.run([sys.executable, "-m", "torchslurm", "train", "--dry-run", "--nproc", "3", "--config",
                             str(tmp_path / "cfg.yaml"), "--lr", "0.2", "run_dir=a b", "amp=bf16"],
                            capture_output=True, text=True, timeout=60, env=clean_environ(**EVERY_STEP))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ("dataset=synthetic model=simple strategy=ddp epochs=7 batch_size=32 lr=0.2 lr_scaling=none "
                        "amp=bf16 grad_clip=0.0 seed=0 run_dir=a b resume=auto")
    assert lines[1] == "local: no launcher found: 3 local rank(s) (--nproc)."
    assert lines[2].endswith(f" -m torchslurm.cli.train --config {tmp_path / 'cfg.yaml'} lr=0.2 'run_dir=a b' amp=bf16")
