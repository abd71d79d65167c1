"""A large checkpoint file's pages go to disk while it is written: the fsync after waits for less,
the bytes and checksums stay the same, and a disk that fails meanwhile fails the save."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchslurm.errors import CheckpointError
from torchslurm.train import checkpoint
from torchslurm.train.checkpoint import hashed, integrity, writeback
from torchslurm.train.checkpoint.layout import FORMAT
from torchslurm.train.checkpoint.state import read_model, split_state
from torchslurm.train.checkpoint.writeback import Writeback
from torchslurm.train.checkpoint.writer import Snapshot, Writer

MIB = 1 << 20


def large_state() -> dict[str, torch.Tensor]:
    """Six tensors of 1.5 MiB: each goes through HashingWriter's large-write path."""
    return {f"w{i}": torch.full((3 * MIB // 8,), float(i)) for i in range(6)}


def test_a_file_sends_its_pages_every_writeback_bytes_and_reads_back_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashed, "WRITEBACK_BYTES", MIB)
    sent: list[str] = []
    early = Writeback()

    def request(fd: int) -> None:
        sent.append(os.readlink(f"/proc/self/fd/{fd}"))
        early.request(fd)

    state = large_state()
    digest = hashed.save(state, tmp_path / "tensors.pt", writeback=request)
    early.join()
    assert sent == [str(tmp_path / "tensors.pt")] * 6  # after each 1.5 MiB tensor: past 1 MiB unsent each time
    assert digest == integrity.of_file(tmp_path / "tensors.pt", integrity.Crc32())
    loaded = torch.load(tmp_path / "tensors.pt", weights_only=True)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_a_small_file_sends_nothing_early(tmp_path: Path) -> None:
    sent: list[int] = []
    hashed.save({"w": torch.ones(1000)}, tmp_path / "small.pt", writeback=sent.append)
    assert sent == []


def test_the_caller_may_close_its_file_while_the_pages_are_being_sent(tmp_path: Path) -> None:
    early = Writeback()
    with open(tmp_path / "f", "wb") as file:
        file.write(b"x" * (4 * MIB))
        file.flush()
        early.request(file.fileno())
    early.join()  # the thread synced its own copy of the descriptor
    assert (tmp_path / "f").stat().st_size == 4 * MIB


def test_a_descriptor_the_kernel_cannot_sync_is_raised_by_join() -> None:
    read_end, write_end = os.pipe()  # fdatasync of a pipe: EINVAL, from the kernel itself
    try:
        early = Writeback()
        early.request(write_end)
        with pytest.raises(OSError) as failed:
            early.join()
        assert failed.value.errno == 22
    finally:
        os.close(read_end)
        os.close(write_end)


def large_snapshot(root: Path, step: int) -> tuple[Snapshot, nn.Module]:
    model = nn.Linear(1024, 1024)  # 4 MiB of weight
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    tensors, plain = split_state(model, optimizer)
    return Snapshot(root, step, tensors, {"rng": 1}, {"format": FORMAT, "optim_plain": plain}, 2), model


WAITED_FOR_NEXT = {"async: fsynced before published": {"defer_fsync": False},
                   "beside, the run's last: fsynced after, waited for": {"defer_fsync": True, "last": True}}


@pytest.mark.parametrize("how", WAITED_FOR_NEXT)
def test_a_save_whose_fsync_is_waited_for_next_sends_early_and_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     how: str) -> None:
    monkeypatch.setattr(hashed, "WRITEBACK_BYTES", MIB)
    sent: list[int] = []
    real = Writeback.request
    monkeypatch.setattr(Writeback, "request", lambda self, fd: (sent.append(fd), real(self, fd)))
    snap, model = large_snapshot(tmp_path, 1)
    writer = Writer()
    writer.start(snap, **WAITED_FOR_NEXT[how])
    assert writer.wait() == checkpoint.step_dir(tmp_path, 1)
    assert sent
    checkpoint.load(checkpoint.step_dir(tmp_path, 1))  # every checksum as recorded
    assert torch.equal(read_model(checkpoint.step_dir(tmp_path, 1))["weight"], model.weight)
    writer.close()


@pytest.mark.parametrize("how", WAITED_FOR_NEXT)
def test_a_disk_that_fails_while_pages_are_sent_fails_the_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               how: str) -> None:
    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(hashed, "WRITEBACK_BYTES", MIB)
    monkeypatch.setattr(writeback.os, "fdatasync", failing)
    writer = Writer()
    writer.start(large_snapshot(tmp_path, 1)[0], **WAITED_FOR_NEXT[how])
    with pytest.raises(CheckpointError, match=r"step 1 could not be written to disk: OSError: .*Input/output error"):
        writer.wait()
    if not WAITED_FOR_NEXT[how]["defer_fsync"]:  # not published: only a checkpoint on disk is
        assert checkpoint.complete(tmp_path) == []
    writer.close()


@pytest.mark.parametrize("last", [False, True])
def test_a_save_on_the_training_thread_sends_early_only_as_the_runs_last(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         last: bool) -> None:
    """Its stall is what a user waits for (benchmarks/checkpoint_stall.py): the Durability thread's fsync
    writes its pages after training has gone on, unless the run ends after it; so does an epoch end's
    save beside validation."""
    monkeypatch.setattr(hashed, "WRITEBACK_BYTES", MIB)
    sent: list[int] = []
    monkeypatch.setattr(Writeback, "request", lambda self, fd: sent.append(fd))
    writer = Writer()
    writer.save(large_snapshot(tmp_path, 1)[0], last=last)
    writer.start(large_snapshot(tmp_path, 2)[0], defer_fsync=True, last=last)
    writer.wait()
    assert bool(sent) == last
    writer.close()


def test_the_trainer_says_last_for_its_final_epochs_save_and_for_a_stop(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from torchslurm.train.config import TrainConfig
    from torchslurm.train.trainer import Trainer

    asked: list[bool] = []
    real_save = Writer.save

    def save(self: Writer, snap: Snapshot, last: bool = False) -> Path:
        asked.append(last)
        return real_save(self, snap, last)

    monkeypatch.setattr(Writer, "save", save)

    def fit(run_dir: Path, stop_at: int | None = None) -> None:
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(32, 4), torch.randint(2, (32,)))
        model = nn.Linear(4, 2)
        config = TrainConfig(epochs=3, batch_size=8, run_dir=run_dir, log_every=0, straggler_every=0, keep_last=1)
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.functional.cross_entropy, data,
                          data, config)
        if stop_at is not None:
            trainer.should_stop = lambda: trainer.global_step == stop_at
        trainer.fit()

    fit(tmp_path / "whole")
    assert asked == [False, False, True]  # a small state: each epoch's save on the training thread
    asked.clear()
    fit(tmp_path / "stopped", stop_at=6)  # mid-epoch 2
    assert asked == [False, True]
