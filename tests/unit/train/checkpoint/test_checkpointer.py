"""The Checkpointer in one process, through its API: a progress value saved and given back, a fresh
start, resume=never, keep_last, a corrupt newest checkpoint skipped, another data order."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from torchslurm.errors import CheckpointError
from torchslurm.train import checkpoint
from torchslurm.train.checkpoint import Checkpointer, TrainProgress
from torchslurm.train.checkpoint.checkpointer import layout_changes
from torchslurm.train.rng import rng_state

ORDER = {"world_size": 1, "batch_size": 4, "seed": 0, "grad_accum_steps": 1}


def _checkpointer(root: Path, seed: int = 0, **options: Any) -> Checkpointer:
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    settings = {"keep_last": 2, "config": {**ORDER, "lr": 0.1}, "order": ORDER, **options}
    return Checkpointer(root, model, optimizer, rank=0, world_size=1, **settings)


def _progress(step: int, batches_done: int = 3) -> TrainProgress:
    return TrainProgress(epoch=1, batches_done=batches_done, global_step=step, sums=[1.5, 2.0, 4.0],
                         rng=rng_state(), scaler={"scale": 2.0}, scheduler={"last_epoch": step})


def test_a_saved_progress_comes_back_with_model_and_optimizer(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    saver = _checkpointer(tmp_path)
    saved = _progress(7)
    with caplog.at_level(logging.INFO, logger="torchslurm.train.trainer"):
        path = saver.save(saved)
    saver.close()
    assert path == saver.last == checkpoint.step_dir(tmp_path, 7) and saver.saved_step == 7
    assert saver.written == ["now"]
    assert f"checkpoint {path} (epoch 2, batch 3, step 7)" in caplog.text
    loader = _checkpointer(tmp_path, seed=1)
    assert not torch.equal(loader.model.weight, saver.model.weight)
    progress = loader.restore("auto")
    assert progress is not None
    assert (progress.epoch, progress.batches_done, progress.global_step) == (1, 3, 7)
    assert progress.sums == [1.5, 2.0, 4.0] and progress.scaler == {"scale": 2.0}
    assert progress.scheduler == {"last_epoch": 7}
    assert progress.rng is not None and saved.rng is not None
    assert torch.equal(progress.rng["torch"], saved.rng["torch"]) and progress.rng["python"] == saved.rng["python"]
    assert torch.equal(loader.model.weight, saver.model.weight)
    momentum = [loader.optimizer.state[p]["momentum_buffer"] for p in loader.model.parameters()]
    assert all(torch.equal(a, saver.optimizer.state[p]["momentum_buffer"])
               for a, p in zip(momentum, saver.model.parameters(), strict=True))


def test_nothing_to_resume_and_resume_never_are_a_fresh_start(tmp_path: Path) -> None:
    assert _checkpointer(tmp_path).restore("auto") is None
    saver = _checkpointer(tmp_path)
    saver.save(_progress(1))
    saver.close()
    assert _checkpointer(tmp_path).restore("never") is None
    named = _checkpointer(tmp_path).restore(str(checkpoint.step_dir(tmp_path, 1)))
    assert named is not None and named.global_step == 1


def test_keep_last_and_a_corrupt_newest_checkpoint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    saver = _checkpointer(tmp_path)
    for step in (1, 2, 3):
        saver.save(_progress(step))
    saver.finish()
    saver.close()
    assert [step for step, _ in checkpoint.complete(tmp_path)] == [2, 3]
    (checkpoint.step_dir(tmp_path, 3) / "tensors.pt").write_bytes(b"junk")
    with caplog.at_level(logging.WARNING):
        progress = _checkpointer(tmp_path).restore("auto")
    assert progress is not None and progress.global_step == 2
    assert "skipping corrupt checkpoint" in caplog.text


def test_another_data_order_restarts_the_epoch_with_fresh_streams(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    saver = _checkpointer(tmp_path)
    saver.save(_progress(5, batches_done=3))
    saver.close()
    loader = _checkpointer(tmp_path, order={**ORDER, "batch_size": 8})
    with caplog.at_level(logging.WARNING):
        progress = loader.restore("auto")
    assert progress is not None and (progress.batches_done, progress.rng, progress.sums) == (0, None, None)
    assert "batch_size was 4, now 8" in caplog.text and "restarting the interrupted epoch" in caplog.text


def test_an_epoch_end_save_beside_validation_is_published_after_it(tmp_path: Path) -> None:
    saver = _checkpointer(tmp_path, overlap_min_bytes=0)  # any size goes beside validation
    with saver.beside(_progress(4, batches_done=0)):
        assert checkpoint.complete(tmp_path) == []  # not published while "validation" runs
    saver.close()
    assert saver.written == ["beside"] and [s for s, _ in checkpoint.complete(tmp_path)] == [4]
    small = _checkpointer(tmp_path / "small")  # below the threshold: written first, on this thread
    with small.beside(_progress(4, batches_done=0)):
        assert [s for s, _ in checkpoint.complete(tmp_path / "small")] == [4]
    assert small.written == ["now"]


def test_progress_says_where_it_is() -> None:
    assert TrainProgress(1, 3, 7).where() == "epoch 2, batch 3"
    assert TrainProgress(2, 0, 9).where() == "after epoch 2"


def test_layout_changes_name_what_moved_the_position_in_the_epoch() -> None:
    state = {"world_size": 4, "config": {"batch_size": 64, "seed": 0, "grad_accum_steps": 1, "lr": 0.1}}
    same = {"world_size": 4, "batch_size": 64, "seed": 0, "grad_accum_steps": 1}
    assert layout_changes(state, same) == ""
    assert layout_changes(state, {**same, "world_size": 2, "batch_size": 32}) == \
        "world_size was 4, now 2, batch_size was 64, now 32"
    old = {"world_size": 1, "config": {"batch_size": 64, "seed": 0}}  # a checkpoint from before grad_accum_steps
    assert layout_changes(old, {"world_size": 1, "grad_accum_steps": 1}) == "grad_accum_steps was unset, now 1"


@pytest.mark.parametrize("finish", [True, False], ids=["run ends", "run killed before its end"])
def test_pruning_never_deletes_the_newest_checkpoint_that_verifies(tmp_path: Path, finish: bool) -> None:
    """keep_last=1 and a corrupt newest: the run resumes from the older good one, saves a step below
    the corrupt one, and pruning keeps what it wrote (and, until that is on disk, what it resumed from)."""
    saver = _checkpointer(tmp_path, keep_last=1)
    saver.save(_progress(1))
    saver.close()
    saver = _checkpointer(tmp_path, keep_last=1)
    saver.save(_progress(3))
    saver.close()
    (checkpoint.step_dir(tmp_path, 3) / "tensors.pt").write_bytes(b"junk")  # COMPLETE, but corrupt
    resumed = _checkpointer(tmp_path, keep_last=1)
    assert resumed.restore("auto").global_step == 1  # type: ignore[union-attr]
    resumed.save(_progress(2))
    assert checkpoint.step_dir(tmp_path, 1).is_dir()  # step 2's fsyncs may still run: 1 is the one on disk
    if finish:
        resumed.finish()
    resumed.close()
    path, state = checkpoint.load_latest(tmp_path) or (None, {})
    assert (path, state["global_step"]) == (checkpoint.step_dir(tmp_path, 2), 2)


def test_a_second_run_in_the_same_folder_is_refused_naming_the_first(tmp_path: Path) -> None:
    first = _checkpointer(tmp_path, environ={"SLURM_JOB_ID": "4242"})
    first.open()
    second = _checkpointer(tmp_path, seed=1)
    with pytest.raises(CheckpointError, match=r"is in use by another run \(host .*, pid \d+, Slurm job 4242, since"):
        second.save(_progress(1))  # would delete the first run's staging folder, prune its checkpoints
    assert not list(tmp_path.glob("step-*")) and not list(tmp_path.glob(".staging-*"))
    first.save(_progress(2))
    first.close()
    second.save(_progress(3))  # free once the first run ended
    second.close()
    assert [step for step, _ in checkpoint.complete(tmp_path)] == [2, 3]


def test_resuming_with_another_model_keeps_the_mismatchs_own_message_and_hint(tmp_path: Path) -> None:
    """Not the wrapper's file-system hint, and no chained traceback: every rank says the same."""
    _checkpointer(tmp_path).save(_progress(7))
    torch.manual_seed(0)
    wider = nn.Linear(4, 2)
    resumer = Checkpointer(tmp_path, wider, torch.optim.SGD(wider.parameters(), lr=0.1), rank=0, world_size=1,
                           keep_last=2, config=ORDER, order=ORDER)
    with pytest.raises(CheckpointError) as caught:
        resumer.restore("auto")
    error = caught.value
    assert str(error).startswith(f"rank 0: checkpoint {tmp_path / 'step-000000007'} was saved from another model")
    assert error.hint is not None and error.hint.startswith("resume with the model and optimizer it was trained with")
    assert "filesystem every node sees" not in str(error)
    assert error.__cause__ is None and error.__suppress_context__
