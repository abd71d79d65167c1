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



class _Planted:
    """A pickle that does something when it is loaded: creates the folder `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return os.makedirs, (str(self.marker),)


def plant_code(folder: Path, marker: Path, entry: str = "model.weight") -> None:
    """Turn the sharded checkpoint `folder` into an attack: its `.metadata` says `entry` is pickled
    bytes (which torch.distributed.checkpoint's default planner loads with weights_only=False), the
    bytes are a pickle that creates `marker`, and COMPLETE's checksums are rewritten to match, as
    anyone who can write the files can do."""
    import json

    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    shards = folder / "shards"
    metadata = pickle.loads((shards / ".metadata").read_bytes())  # the test's own file: trusted here
    payload = io.BytesIO()
    torch.save(_Planted(marker), payload)
    (shards / "planted.distcp").write_bytes(payload.getvalue())
    metadata.state_dict_metadata[entry] = BytesStorageMetadata()
    metadata.storage_data[MetadataIndex(entry)] = _StorageInfo("planted.distcp", 0, len(payload.getvalue()))
    (shards / ".metadata").write_bytes(pickle.dumps(metadata))
    files = {str(p.relative_to(folder)): checkpoint.integrity.of_file(p, checkpoint.integrity.Crc32())
             for p in folder.rglob("*") if p.is_file() and p.name != "COMPLETE"}
    (folder / "COMPLETE").write_text(json.dumps({"step": 2, "format": 2, "files": files}))


def test_a_sharded_checkpoint_that_would_unpickle_code_is_refused_on_resume(tmp_path: Path) -> None:
    """A crafted shards/ checkpoint (checksums and all) never runs its code on resume=auto."""
    import shutil

    from torch import nn
    from torch.utils.data import TensorDataset

    from torchslurm.train.trainer import TrainConfig, Trainer

    fixture = Path(__file__).parents[3] / "fixtures" / "checkpoints" / "format2-shards"
    shutil.copytree(fixture, tmp_path / "checkpoints", ignore=shutil.ignore_patterns("expected.json"))
    marker = tmp_path / "code-ran"
    plant_code(tmp_path / "checkpoints" / "step-000000002", marker)
    model = nn.Linear(3, 2)
    data = TensorDataset(torch.randn(8, 3), torch.tensor([0, 1] * 4))
    config = TrainConfig(epochs=2, batch_size=4, lr=0.1, run_dir=tmp_path, log_every=0)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nn.functional.cross_entropy,
                      data, data, config, environ={})
    with pytest.raises(CheckpointError, match=r"shards/.metadata: model.weight is stored as pickled bytes.*"
                                              r"HINT: .*not written by torchslurm"):
        trainer.fit()
    assert not marker.exists()


def _shards_copy(tmp_path: Path) -> Path:
    import shutil

    fixture = Path(__file__).parents[3] / "fixtures" / "checkpoints" / "format2-shards" / "step-000000002"
    return Path(shutil.copytree(fixture, tmp_path / "step-000000002"))


def test_the_safe_reader_refuses_pickled_entries_files_outside_and_rank_local_metadata(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

    from torchslurm.train.checkpoint.state import read_model

    folder = _shards_copy(tmp_path)
    plant_code(folder, tmp_path / "code-ran", entry="optim.state.weight.momentum_buffer")
    with pytest.raises(CheckpointError, match=r"optim.state.weight.momentum_buffer is stored as pickled bytes"):
        read_model(folder)
    with pytest.raises(CheckpointError, match=r"rank-local metadata.*HINT: it was not written by torchslurm"):
        SafeReader(folder / "shards").read_metadata(rank=0)
    item = ReadItem(LoadItemType.BYTE_IO, MetadataIndex("x"), torch.Size([0]), MetadataIndex("x"),
                    torch.Size([0]), torch.Size([0]))  # as a planner given other metadata would ask
    with pytest.raises(CheckpointError, match=r"x is stored as pickled bytes"):
        SafeReader(folder / "shards").read_data(LoadPlan([item]), None)
    assert not (tmp_path / "code-ran").exists()
    folder = _shards_copy(tmp_path / "other")
    metadata = pickle.loads((folder / "shards" / ".metadata").read_bytes())
    for info in metadata.storage_data.values():
        info.relative_path = "../../state.pt"
    (folder / "shards" / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match=r"points at '\.\./\.\./state\.pt', outside its folder"):
        SafeReader(folder / "shards").read_metadata()
