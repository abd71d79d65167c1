"""Writing checkpoints: on the training thread with fsyncs after, in the background from staged copies."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tests.unit.train.checkpoint.conftest import linear_snapshot
from torch import nn

from torchslurm.errors import CheckpointError
from torchslurm.train import checkpoint
from torchslurm.train.checkpoint.layout import FORMAT
from torchslurm.train.checkpoint.state import read_model, split_state
from torchslurm.train.checkpoint.writer import Snapshot, Writer


def test_background_staging_reuses_its_buffers_and_copies(tmp_path: Path) -> None:
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    writer = Writer()
    tensors, plain = split_state(model, optimizer)
    first = writer.stage(tensors)
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on: the staged copy must not see it
    assert not torch.equal(first["model.weight"], model.weight)
    writer.start(Snapshot(tmp_path, 1, first, {"rng": 1}, {"format": FORMAT, "optim_plain": plain}, 2))
    second = writer.stage(split_state(model, optimizer)[0])  # waits for the save reading `first`
    assert torch.equal(second["model.weight"], model.weight)
    assert second["model.weight"].data_ptr() == first["model.weight"].data_ptr()  # the same memory, refilled
    assert writer.wait() == checkpoint.step_dir(tmp_path, 1)
    assert not torch.equal(read_model(checkpoint.step_dir(tmp_path, 1))["weight"], model.weight)


def _steps(root: Path) -> list[int]:
    return [step for step, _ in checkpoint.complete(root)]


def test_a_save_on_the_training_thread_keeps_the_previous_checkpoint_until_the_run_ends(tmp_path: Path) -> None:
    """keep_last=1: a new checkpoint's files are fsynced after it is published, so the one before it
    stays until the next save has joined that fsync; finish() then leaves keep_last."""
    writer = Writer()
    for step in (1, 2, 3):
        writer.save(linear_snapshot(tmp_path, step, keep_last=1)[0])
    assert _steps(tmp_path) == [2, 3]
    writer.finish(tmp_path, keep_last=1)
    writer.close()  # the old ones were renamed away at once; close() waits for their deletion
    assert _steps(tmp_path) == [3]
    assert [p.name for p in tmp_path.iterdir()] == ["step-000000003"]
    checkpoint.load(checkpoint.step_dir(tmp_path, 3))  # checksums as recorded


def test_the_fsync_thread_syncs_every_file_and_folder_of_the_checkpoint(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    writer = Writer()
    folder = writer.save(linear_snapshot(tmp_path, 4, keep_last=2)[0])
    writer.wait()
    files = {str(p) for p in folder.rglob("*")} | {str(folder), str(tmp_path)}
    assert set(synced) == files  # each once: the tensors, rank and state files, COMPLETE, the folder, the root
    assert len(synced) == len(files)


def test_a_failed_fsync_is_an_error_on_the_training_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    writer = Writer()
    monkeypatch.setattr(os, "fsync", failing_fsync)
    writer.save(linear_snapshot(tmp_path, 1, keep_last=2)[0])
    with pytest.raises(CheckpointError, match=r"step 1 could not be written to disk: OSError: .*Input/output error.*"
                                              r"HINT: check free"):
        writer.wait()


def full_disk_for(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Checkpoint files called `name` written to /dev/full: the kernel's own ENOSPC, as a full disk gives."""
    from torchslurm.train.checkpoint import hashed

    real = hashed.open_write

    def opening(path: Path, mode: str = "w") -> object:
        return open("/dev/full", mode) if Path(path).name == name else real(path, mode)

    monkeypatch.setattr(hashed, "open_write", opening)


@pytest.mark.parametrize("how", ["now", "background"])
def test_a_full_disk_is_one_clear_error_on_both_paths_and_keeps_the_previous_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    from torchslurm.exitcodes import FAILED_EXIT_CODE

    writer = Writer()
    writer.save(linear_snapshot(tmp_path, 1, keep_last=1)[0])
    writer.wait()
    full_disk_for(monkeypatch, "tensors.pt")
    snap = linear_snapshot(tmp_path, 2, keep_last=1)[0]
    expected = (r"^the checkpoint of step 2 could not be written to disk \(it is full\): OSError: \[Errno 28\] No "
                r"space left on device\. HINT: free space \(or quota\) on run_dir's file system; the checkpoints saved "
                r"before are kept")
    with pytest.raises(CheckpointError, match=expected) as failed:
        if how == "now":
            writer.save(snap)
        else:
            writer.start(snap)
            writer.wait()
    assert failed.value.exit_code == FAILED_EXIT_CODE
    assert _steps(tmp_path) == [1]
    checkpoint.load(checkpoint.step_dir(tmp_path, 1))
    writer.close()
