"""Loading: checksums verified first, corrupt checkpoints skipped, nothing but tensors and plain types."""

from __future__ import annotations

import io
import logging
import pickle
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from tests.unit.train.checkpoint.format1 import write_format1

from torchslurm.errors import CheckpointError
from torchslurm.train import checkpoint
from torchslurm.train.checkpoint.reading import SafeReader


def _state(step: int) -> dict[str, object]:
    return {"step": step, "weights": torch.full((3,), float(step)), "rng": [1, 2, 3], "cfg": {"lr": 0.1}}


def test_save_load_roundtrip(tmp_path: Path) -> None:
    path = write_format1(tmp_path, 7, _state(7))
    assert path == tmp_path / "step-000000007"
    assert sorted(p.name for p in path.iterdir()) == ["COMPLETE", "state.pt"]
    state = checkpoint.load(path)
    assert state["step"] == 7 and torch.equal(state["weights"], torch.full((3,), 7.0))


def test_unfinished_checkpoint_is_invisible(tmp_path: Path) -> None:
    write_format1(tmp_path, 1, _state(1))
    (tmp_path / "step-000000002").mkdir()  # a writer died before the marker
    torch.save(_state(2), tmp_path / "step-000000002" / "state.pt")
    path, state = checkpoint.load_latest(tmp_path) or (None, {})
    assert path == tmp_path / "step-000000001" and state["step"] == 1
    with pytest.raises(CheckpointError, match=r"has no COMPLETE marker: its writer did not finish\. HINT"):
        checkpoint.load(tmp_path / "step-000000002")


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_newest_falls_back_with_warning(tmp_path: Path, damage: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    write_format1(tmp_path, 1, _state(1))
    newest = write_format1(tmp_path, 2, _state(2)) / "state.pt"
    raw = newest.read_bytes()
    newest.write_bytes(raw[: len(raw) // 2] if damage == "truncate" else raw[:100] + b"\xff" + raw[101:])
    with caplog.at_level(logging.WARNING, logger="torchslurm.train.checkpoint.reading"):
        path, state = checkpoint.load_latest(tmp_path) or (None, {})
    assert state["step"] == 1 and path == tmp_path / "step-000000001"
    assert "skipping corrupt checkpoint" in caplog.text and "step-000000002" in caplog.text


def test_all_corrupt_is_an_error(tmp_path: Path) -> None:
    (write_format1(tmp_path, 1, _state(1)) / "state.pt").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match=r"all 1 checkpoints in .* are corrupt.*HINT: delete"):
        checkpoint.load_latest(tmp_path)


def test_no_checkpoints_is_none(tmp_path: Path) -> None:
    assert checkpoint.load_latest(tmp_path / "absent") is None


def test_arbitrary_objects_are_refused(tmp_path: Path) -> None:
    path = write_format1(tmp_path, 1, {"obj": Fraction(1, 3)})  # any class outside the allowlist
    with pytest.raises(CheckpointError, match=r"could not be loaded with weights_only=True: "
                       r"Unsupported global: GLOBAL fractions.Fraction.*HINT"):
        checkpoint.load(path)


def test_missing_path_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no state.pt in .*HINT: pass resume="):
        checkpoint.load(tmp_path / "nope")


def test_metadata_reader_refuses_other_objects(tmp_path: Path) -> None:
    (tmp_path / ".metadata").write_bytes(pickle.dumps(io.StringIO("x")))
    with pytest.raises(CheckpointError, match=r"_io.StringIO is not allowed in checkpoint metadata"):
        SafeReader(tmp_path).read_metadata()

