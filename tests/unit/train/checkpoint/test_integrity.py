"""The checksums COMPLETE records: CRC-32 of every file as written, older sha256 markers still verified."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from tests.unit.train.checkpoint.conftest import linear_snapshot
from torch import nn

from torchslurm.errors import CheckpointError
from torchslurm.train import checkpoint
from torchslurm.train.checkpoint import integrity
from torchslurm.train.checkpoint.layout import FORMAT, MARKER, rank_file
from torchslurm.train.checkpoint.state import split_state
from torchslurm.train.checkpoint.writer import Snapshot, write


def test_checksums_taken_while_writing_are_those_of_the_files_on_disk(tmp_path: Path) -> None:
    """Large tensors are checksummed on a helper thread while written, small writes inline: either
    way COMPLETE lists every file of the folder with the CRC-32 of its bytes as read back."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 3))  # a 4 MiB weight: the threaded path
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 1024)).sum().backward()
    optimizer.step()
    tensors, plain = split_state(model, optimizer)
    folder = write(Snapshot(tmp_path, 3, tensors, {"rng": 1}, {"format": FORMAT, "optim_plain": plain},
                                    keep_last=2))
    files = json.loads((folder / MARKER).read_text())["files"]
    on_disk = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} - {MARKER}
    assert set(files) == on_disk
    assert files == {name: integrity.of_file(folder / name, integrity.Crc32()) for name in on_disk}
    assert (folder / "tensors.pt").stat().st_size > 3 * 4 << 20  # weights and 2 moments


def test_markers_with_sha256_checksums_still_verify(tmp_path: Path) -> None:
    """Sharded checkpoints written before CRC-32 record sha256 digests: they load, and a corrupt file
    among them is still found."""
    folder = write(linear_snapshot(tmp_path, 1, keep_last=2)[0])
    marker_file = folder / MARKER
    marker = json.loads(marker_file.read_text())
    marker["files"] = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in marker["files"]}
    marker_file.write_text(json.dumps(marker))
    checkpoint.load(folder)
    (folder / rank_file(0)).write_bytes(b"junk")
    with pytest.raises(CheckpointError, match=r"rank-00000.pt has checksum [0-9a-f]{12}.* corrupt"):
        checkpoint.load(folder)


def test_a_marker_that_names_files_outside_its_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / MARKER).write_text(json.dumps({"step": 1, "files": {"../../etc/passwd": "crc32:00000000"}}))
    with pytest.raises(CheckpointError, match="names files outside the folder"):
        integrity.verify(tmp_path)
    (tmp_path / MARKER).write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable COMPLETE marker"):
        integrity.verify(tmp_path)


def test_a_file_the_marker_lists_must_exist(tmp_path: Path) -> None:
    (tmp_path / MARKER).write_text(json.dumps({"step": 1, "files": {"state.pt": "crc32:00000000"}}))
    with pytest.raises(CheckpointError, match=r"state\.pt is missing, though its COMPLETE marker lists it"):
        integrity.verify(tmp_path)


def test_crc32_is_zlibs_from_its_standard_start() -> None:
    digest = integrity.new()
    digest.update(b"12345")
    digest.update(b"6789")
    assert digest.hexdigest() == "crc32:cbf43926"  # CRC-32's check value for "123456789"
    assert integrity.new().hexdigest() == "crc32:00000000"


@pytest.mark.parametrize(("files", "why"), [
    (["state.pt"], "files is not a mapping of names to checksums"),
    ({"state.pt": 1}, "files is not a mapping of names to checksums"),
    (None, "files is not a mapping of names to checksums"),
])
def test_a_marker_whose_files_are_no_mapping_of_checksums_is_refused_with_the_reason(
        tmp_path: Path, files: object, why: str) -> None:
    (tmp_path / MARKER).write_text(json.dumps({"step": 1, "files": files}))
    with pytest.raises(CheckpointError) as info:
        integrity.verify(tmp_path)
    assert str(info.value) == (f"checkpoint {tmp_path}: unreadable COMPLETE marker ({why}). HINT: delete this "
                               "directory; resume=auto then uses the previous one.")


def test_refusals_of_a_marker_name_the_folder_and_say_what_to_do(tmp_path: Path) -> None:
    (tmp_path / MARKER).write_text(json.dumps({"step": 1, "files": {"a/../../x": "crc32:00000000"}}))
    with pytest.raises(CheckpointError) as info:
        integrity.verify(tmp_path)
    assert str(info.value) == (f"checkpoint {tmp_path}: its COMPLETE marker names files outside the folder. HINT: "
                               "it was not written by torchslurm; delete this directory.")
    (tmp_path / MARKER).write_text(json.dumps({"step": 1, "files": {"state.pt": "crc32:00000000"}}))
    with pytest.raises(CheckpointError) as info:
        integrity.verify(tmp_path)
    assert str(info.value) == (f"checkpoint {tmp_path}: state.pt is missing, though its COMPLETE marker lists it. "
                               "HINT: delete this directory; resume=auto then uses the previous complete checkpoint.")


def test_a_checksum_mismatch_names_both_checksums(tmp_path: Path) -> None:
    (tmp_path / "state.pt").write_bytes(b"123456789")
    sha = hashlib.sha256(b"other").hexdigest()
    for recorded, actual in (("crc32:00000000", "crc32:cbf43926"), (sha, hashlib.sha256(b"123456789").hexdigest())):
        (tmp_path / MARKER).write_text(json.dumps({"step": 1, "files": {"state.pt": recorded}}))
        with pytest.raises(CheckpointError) as info:
            integrity.verify(tmp_path)
        assert str(info.value) == (
            f"checkpoint {tmp_path / 'state.pt'} has checksum {actual[:14]}…, but its marker says {recorded[:14]}…: "
            "the file is corrupt or truncated. HINT: delete this directory; resume=auto then uses the previous "
            "complete checkpoint.")
    (tmp_path / MARKER).write_text(json.dumps({"step": 1, "sha256": hashlib.sha256(b"123456789").hexdigest()}))
    integrity.verify(tmp_path)  # a format-1 marker: the one sha256 of state.pt


def test_a_file_is_checksummed_a_mebibyte_at_a_time(tmp_path: Path) -> None:
    """A shard of many GB is never held in memory whole to be checksummed."""

    class Recording:
        def __init__(self) -> None:
            self.sizes: list[int] = []

        def update(self, data: bytes, /) -> None:
            self.sizes.append(len(data))

        def hexdigest(self) -> str:
            return "recorded"

    (tmp_path / "shard").write_bytes(b"x" * (5 << 19))
    digest = Recording()
    assert integrity.of_file(tmp_path / "shard", digest) == "recorded"
    assert digest.sizes == [1 << 20, 1 << 20, 1 << 19]
