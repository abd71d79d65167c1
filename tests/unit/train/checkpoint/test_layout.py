"""The folder protocol: step-N folders that count once COMPLETE exists, staging, pruning, leftovers."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
import torch
from tests.unit.train.checkpoint.format1 import write_format1

from torchslurm.train import checkpoint
from torchslurm.train.checkpoint import layout
from torchslurm.train.checkpoint.layout import Pruner, folder_of, publish, rank_file, staging_dir, step_dir


def _state(step: int) -> dict[str, object]:
    return {"step": step, "weights": torch.full((3,), float(step)), "rng": [1, 2, 3], "cfg": {"lr": 0.1}}


def test_keep_last_keeps_newest_complete(tmp_path: Path) -> None:
    pruner = Pruner()
    for step in (1, 2, 3, 4):
        write_format1(tmp_path, step, _state(step), keep_last=2, pruner=pruner)
    assert [s for s, _ in checkpoint.complete(tmp_path)] == [3, 4]
    assert not list(tmp_path.glob(".staging-*"))
    pruner.wait()  # the older ones were renamed away at once, then deleted in the background
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000003", "step-000000004"]


def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    write_format1(tmp_path, 5, _state(5))
    write_format1(tmp_path, 5, {**_state(5), "extra": 1})
    assert checkpoint.load(tmp_path / "step-000000005")["extra"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["step-000000005"]


def test_a_writer_killed_mid_save_leaves_nothing_that_counts(tmp_path: Path) -> None:
    write_format1(tmp_path, 1, _state(1))
    dead = tmp_path / ".staging-000000002-99999"  # what kill -9 during torch.save leaves behind
    dead.mkdir()
    (dead / "state.pt").write_bytes(b"half a file")
    assert [s for s, _ in checkpoint.complete(tmp_path)] == [1]
    assert checkpoint.load_latest(tmp_path) is not None
    write_format1(tmp_path, 3, _state(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000001", "step-000000003"]


def test_the_names_of_a_checkpoints_parts() -> None:
    root = Path("/runs/a/checkpoints")
    assert step_dir(root, 7) == root / "step-000000007"
    assert staging_dir(root, 7, "1f2e") == root / ".staging-000000007-1f2e"
    assert rank_file(12) == "rank-00012.pt"
    folder = root / "step-000000007"
    assert folder_of(folder / "state.pt") == folder_of(folder) == folder


def test_only_folders_with_a_marker_count_oldest_first(tmp_path: Path) -> None:
    for step, marked in ((10, True), (2, True), (30, False)):
        step_dir(tmp_path, step).mkdir()
        if marked:
            (step_dir(tmp_path, step) / "COMPLETE").write_text("{}")
    (tmp_path / "notes").mkdir()
    assert checkpoint.complete(tmp_path) == [(2, step_dir(tmp_path, 2)), (10, step_dir(tmp_path, 10))]
    assert checkpoint.complete(tmp_path / "absent") == []


def test_the_newest_verified_checkpoint_is_never_pruned(tmp_path: Path) -> None:
    for step in (1, 5, 9):
        step_dir(tmp_path, step).mkdir()
        (step_dir(tmp_path, step) / "COMPLETE").write_text("{}")
    pruner = Pruner()
    pruner.verified(step_dir(tmp_path, 1))
    pruner.verified(step_dir(tmp_path, 5))  # 9 has a marker, but nothing said that its files verify
    assert pruner.prune(tmp_path, keep_last=1) == [step_dir(tmp_path, 1)]
    pruner.unverified(step_dir(tmp_path, 5))  # being replaced by a save not yet on disk
    assert pruner.prune(tmp_path, keep_last=1) == [step_dir(tmp_path, 5)]
    pruner.wait()
    assert [s for s, _ in checkpoint.complete(tmp_path)] == [9]


def test_a_checkpoint_is_never_written_into_a_folder_a_link_points_to(tmp_path: Path) -> None:
    from torchslurm.errors import CheckpointError
    from torchslurm.train.checkpoint.layout import own_folder

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / ".staging-000000001-abc").symlink_to(elsewhere)
    with pytest.raises(CheckpointError, match=r"staging-000000001-abc is a symbolic link.*HINT: remove the link"):
        own_folder(root / ".staging-000000001-abc")
    own_folder(root / ".staging-000000002-abc" / "shards")
    assert (root / ".staging-000000002-abc" / "shards").is_dir() and list(elsewhere.iterdir()) == []


def _marked(root: Path, *steps: int) -> list[Path]:
    for step in steps:
        step_dir(root, step).mkdir(parents=True)
        (step_dir(root, step) / "COMPLETE").write_text("{}")
    return [step_dir(root, step) for step in steps]


def test_of_several_verified_checkpoints_only_the_newest_is_spared(tmp_path: Path) -> None:
    one, five, nine, _ = _marked(tmp_path, 1, 5, 9, 13)
    pruner = Pruner()
    for path in (one, five, nine):
        pruner.verified(path)  # 13 has a marker, but nothing said that its files verify
    assert pruner.prune(tmp_path, keep_last=1) == [one, five]
    pruner.wait()


def test_a_durable_publish_counts_as_verified_and_logs_the_checkpoint(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    staging = tmp_path / ".staging-000000001-abc"
    staging.mkdir()
    (staging / "COMPLETE").write_text("{}")
    pruner = Pruner()
    with caplog.at_level(logging.DEBUG, logger="torchslurm.train.checkpoint.layout"):
        publish(staging, step_dir(tmp_path, 1), keep_last=1, pruner=pruner)
    assert caplog.messages == [f"checkpoint saved: {step_dir(tmp_path, 1)}"]
    _marked(tmp_path, 2)  # newer, with a marker, not known to verify
    assert pruner.prune(tmp_path, keep_last=1) == []  # step 1 is the newest that verifies: it stays


def test_old_checkpoints_are_deleted_by_a_daemon_thread_of_their_own(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon: an ending run does not wait for a large checkpoint's files to be deleted."""
    seen: list[tuple[str, bool, list[str]]] = []
    monkeypatch.setattr(layout, "_delete", lambda paths: seen.append(
        (threading.current_thread().name, threading.current_thread().daemon, [p.name[:21] for p in paths])))
    _marked(tmp_path, 1, 2, 3)
    pruner = Pruner()
    pruner.prune(tmp_path, keep_last=1)
    pruner.wait()
    assert seen == [("torchslurm-prune", True, [".trash-step-000000001", ".trash-step-000000002"])]


def test_a_trash_folder_that_is_gone_does_not_stop_the_deletion_of_the_others(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "f").write_text("x")
    layout._delete([tmp_path / "a", tmp_path / "b"])
    assert list(tmp_path.iterdir()) == []


def test_leftovers_of_interrupted_saves_go_except_those_of_the_save_in_progress(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for name in (".staging-000000002-dead", ".trash-step-000000001-77-88", ".staging-000000003-live"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.pt").write_bytes(b"x")
    (tmp_path / ".staging-junk").write_text("a file, not a folder: left alone, no error")
    _marked(tmp_path, 1)
    with caplog.at_level(logging.DEBUG, logger="torchslurm.train.checkpoint.layout"):
        layout.remove_leftovers(tmp_path, keep="-live")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".staging-000000003-live", ".staging-junk",
                                                          "step-000000001"]
    assert sorted(caplog.messages) == [f"removing {tmp_path / name}, left by an interrupted save" for name in
                                       (".staging-000000002-dead", ".staging-junk", ".trash-step-000000001-77-88")]
    layout.remove_leftovers(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".staging-junk", "step-000000001"]
    layout.remove_leftovers(tmp_path / "absent")  # no run_dir yet: nothing to do
