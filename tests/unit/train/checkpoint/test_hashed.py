"""Files checksummed while written: the digest is that of the bytes on disk, whichever way they went."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from torchslurm.train.checkpoint import hashed, integrity


@pytest.mark.parametrize("threaded", [False, True])
def test_small_and_large_writes_in_order_give_the_files_checksum(tmp_path: Path, threaded: bool) -> None:
    pieces = [b"header", bytes(range(256)) * 5000, b"x" * 10, memoryview(bytes(hashed.PARALLEL_BYTES)), b"tail"]
    path = tmp_path / "file"
    with ThreadPoolExecutor(1) if threaded else nullcontext() as pool, open(path, "wb") as file:
        writer = hashed.HashingWriter(file, pool)
        for piece in pieces:
            assert writer.write(piece) == len(piece)
        assert writer.tell() == sum(len(p) for p in pieces)
        digest = writer.hexdigest()
        writer.close()
    assert path.read_bytes() == b"".join(bytes(p) for p in pieces)
    assert digest == integrity.of_file(path, integrity.Crc32())


def test_torch_save_through_it_loads_and_matches(tmp_path: Path) -> None:
    state = {"w": torch.arange(300_000, dtype=torch.float32), "step": 3}
    digest = hashed.save(state, tmp_path / "state.pt")
    assert digest == integrity.of_file(tmp_path / "state.pt", integrity.Crc32())
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 3


def test_files_saved_without_record_crc32s_still_load(tmp_path: Path) -> None:
    with hashed.without_record_crc32():
        digest = hashed.save({"w": torch.ones(4)}, tmp_path / "fast.pt")
    assert digest == integrity.of_file(tmp_path / "fast.pt", integrity.Crc32())
    assert torch.equal(torch.load(tmp_path / "fast.pt", weights_only=True)["w"], torch.ones(4))
