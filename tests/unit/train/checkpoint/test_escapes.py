"""The checkpoint folder protocol as a run sees it (save, keep_last, resume=auto), against the bugs that
shipped green before (docs/testing.md): each test fails under one wrong program that the other tests let
through. Written against the public behaviour only: `Checkpointer`, `complete()`, `load()`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from torchslurm.errors import CheckpointError
from torchslurm.train import checkpoint
from torchslurm.train.checkpoint import MARKER, Checkpointer, TrainProgress

ORDER = {"world_size": 1, "batch_size": 4, "seed": 0, "grad_accum_steps": 1}


def _checkpointer(root: Path, keep_last: int = 2) -> Checkpointer:
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return Checkpointer(root, model, optimizer, rank=0, world_size=1, keep_last=keep_last,
                        config={**ORDER, "lr": 0.1}, order=ORDER)


def _save(saver: Checkpointer, *steps: int) -> None:
    for step in steps:
        saver.save(TrainProgress(epoch=0, batches_done=step, global_step=step, sums=[0.0, 0.0, 0.0]))
    saver.finish()  # the end of a run: only the newest keep_last stay
    saver.close()


def test_a_stray_step_folder_without_a_marker_is_never_kept_nor_resumed(tmp_path: Path) -> None:
    """A half-copied run_dir holds a newer step-N folder with no COMPLETE marker: keep_last=1 must keep
    the real checkpoint, not count the stray one and delete the real one."""
    stray = checkpoint.step_dir(tmp_path, 900)
    stray.mkdir(parents=True)
    (stray / "state.pt").write_bytes(b"half a copy")
    _save(_checkpointer(tmp_path, keep_last=1), 3, 5)
    assert checkpoint.complete(tmp_path) == [(5, checkpoint.step_dir(tmp_path, 5))]
    progress = _checkpointer(tmp_path).restore("auto")
    assert progress is not None and progress.global_step == 5


@pytest.mark.parametrize("lost", ["tensors.pt", "rank-00000.pt", "state.pt"])
def test_resume_auto_falls_back_when_a_file_the_marker_lists_is_gone(
        tmp_path: Path, lost: str, caplog: pytest.LogCaptureFixture) -> None:
    """A listed file missing on disk (a partial copy, a cleaner that ran) makes the checkpoint corrupt:
    resume=auto warns and takes the one before, it does not crash."""
    _save(_checkpointer(tmp_path), 3, 5)
    newest = checkpoint.step_dir(tmp_path, 5)
    assert lost in json.loads((newest / MARKER).read_text())["files"]
    (newest / lost).unlink()
    with caplog.at_level(logging.WARNING, logger="torchslurm.train.checkpoint"):
        progress = _checkpointer(tmp_path).restore("auto")
    assert progress is not None and progress.global_step == 3
    assert f"skipping corrupt checkpoint {newest}" in caplog.text and lost in caplog.text


@pytest.mark.parametrize("name", ["../state.pt", "shards/../../state.pt", "/etc/passwd", "//srv/x"])
def test_a_marker_naming_a_file_outside_its_folder_is_refused(tmp_path: Path, name: str) -> None:
    """Both `..` parts and absolute names leave the folder: neither is read nor hashed."""
    _save(_checkpointer(tmp_path), 3)
    folder = checkpoint.step_dir(tmp_path, 3)
    marker = json.loads((folder / MARKER).read_text())
    marker["files"][name] = "crc32:00000000"
    (folder / MARKER).write_text(json.dumps(marker))
    with pytest.raises(CheckpointError, match=r"its COMPLETE marker names files outside the folder.*HINT"):
        checkpoint.load(folder)
