import logging
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from torchslurm.errors import CheckpointError
from torchslurm.train import checkpoint


def _state(step: int) -> dict[str, object]:
    return {"step": step, "weights": torch.full((3,), float(step)), "rng": [1, 2, 3], "cfg": {"lr": 0.1}}


def test_save_load_roundtrip(tmp_path: Path) -> None:
    path = checkpoint.save(tmp_path, 7, _state(7))
    assert path == tmp_path / "step-000000007"
    assert sorted(p.name for p in path.iterdir()) == ["COMPLETE", "state.pt"]
    state = checkpoint.load(path)
    assert state["step"] == 7 and torch.equal(state["weights"], torch.full((3,), 7.0))


def test_keep_last_keeps_newest_complete(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        checkpoint.save(tmp_path, step, _state(step), keep_last=2)
    assert [s for s, _ in checkpoint.complete(tmp_path)] == [3, 4]
    assert not list(tmp_path.glob(".staging-*"))
    checkpoint.wait_for_deletes()  # the older ones were renamed away at once, then deleted in the background
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000003", "step-000000004"]


def test_unfinished_checkpoint_is_invisible(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 1, _state(1))
    (tmp_path / "step-000000002").mkdir()  # a writer died before the marker
    torch.save(_state(2), tmp_path / "step-000000002" / "state.pt")
    path, state = checkpoint.load_latest(tmp_path) or (None, {})
    assert path == tmp_path / "step-000000001" and state["step"] == 1
    with pytest.raises(CheckpointError, match=r"has no COMPLETE marker: its writer did not finish\. HINT"):
        checkpoint.load(tmp_path / "step-000000002")


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_newest_falls_back_with_warning(tmp_path: Path, damage: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    checkpoint.save(tmp_path, 1, _state(1))
    newest = checkpoint.save(tmp_path, 2, _state(2)) / "state.pt"
    raw = newest.read_bytes()
    newest.write_bytes(raw[: len(raw) // 2] if damage == "truncate" else raw[:100] + b"\xff" + raw[101:])
    with caplog.at_level(logging.WARNING, logger="torchslurm.train.checkpoint"):
        path, state = checkpoint.load_latest(tmp_path) or (None, {})
    assert state["step"] == 1 and path == tmp_path / "step-000000001"
    assert "skipping corrupt checkpoint" in caplog.text and "step-000000002" in caplog.text


def test_all_corrupt_is_an_error(tmp_path: Path) -> None:
    (checkpoint.save(tmp_path, 1, _state(1)) / "state.pt").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match=r"all 1 checkpoints in .* are corrupt.*HINT: delete"):
        checkpoint.load_latest(tmp_path)


def test_no_checkpoints_is_none(tmp_path: Path) -> None:
    assert checkpoint.load_latest(tmp_path / "absent") is None


def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 5, _state(5))
    checkpoint.save(tmp_path, 5, {**_state(5), "extra": 1})
    assert checkpoint.load(tmp_path / "step-000000005")["extra"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["step-000000005"]


def test_arbitrary_objects_are_refused(tmp_path: Path) -> None:
    path = checkpoint.save(tmp_path, 1, {"obj": Fraction(1, 3)})  # any class outside the allowlist
    with pytest.raises(CheckpointError, match=r"could not be loaded with weights_only=True: "
                       r"Unsupported global: GLOBAL fractions.Fraction.*HINT"):
        checkpoint.load(path)


def test_missing_path_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no state.pt in .*HINT: pass resume="):
        checkpoint.load(tmp_path / "nope")


def test_a_writer_killed_mid_save_leaves_nothing_that_counts(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 1, _state(1))
    dead = tmp_path / ".staging-000000002-99999"  # what kill -9 during torch.save leaves behind
    dead.mkdir()
    (dead / "state.pt").write_bytes(b"half a file")
    assert [s for s, _ in checkpoint.complete(tmp_path)] == [1]
    assert checkpoint.load_latest(tmp_path) is not None
    checkpoint.save(tmp_path, 3, _state(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000001", "step-000000003"]


def test_layout_changes_name_what_moved_the_position_in_the_epoch() -> None:
    state = {"world_size": 4, "config": {"batch_size": 64, "seed": 0, "grad_accum_steps": 1, "lr": 0.1}}
    same = {"world_size": 4, "batch_size": 64, "seed": 0, "grad_accum_steps": 1}
    assert checkpoint.layout_changes(state, same) == ""
    assert checkpoint.layout_changes(state, {**same, "world_size": 2, "batch_size": 32}) == \
        "world_size was 4, now 2, batch_size was 64, now 32"
    old = {"world_size": 1, "config": {"batch_size": 64, "seed": 0}}  # a checkpoint from before grad_accum_steps
    assert checkpoint.layout_changes(old, {"world_size": 1, "grad_accum_steps": 1}) == \
        "grad_accum_steps was unset, now 1"
