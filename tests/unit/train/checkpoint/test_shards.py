"""FSDP's sharded tensors, one file per rank: the parts a rank writes, and the pieces of them copied
into tensors spread another way (resharding), checked element by element."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.unit.train.checkpoint.conftest import sharded_gpt
from torch import nn

from torchslurm.errors import CheckpointError
from torchslurm.train import checkpoint
from torchslurm.train.checkpoint import shards
from torchslurm.train.checkpoint.layout import FORMAT, MARKER, shard_file
from torchslurm.train.checkpoint.state import load_into, read_model, split_state
from torchslurm.train.checkpoint.writer import Snapshot, write
from torchslurm.train.models import GPT


def _cuts(size: int, ranks: int) -> list[tuple[int, int]]:
    """(start, stop) of each rank's rows, as torch.chunk cuts them (the last ones may be short or empty)."""
    step = -(-size // ranks)
    return [(min(r * step, size), min((r + 1) * step, size)) for r in range(ranks)]


@pytest.mark.parametrize(("saved", "loaded", "dim"), [(4, 3, 0), (3, 4, 0), (2, 5, 1), (1, 3, 0), (4, 1, 1)])
def test_parts_saved_on_some_ranks_fill_the_parts_of_any_other_number(saved: int, loaded: int, dim: int) -> None:
    whole = torch.arange(7 * 6, dtype=torch.float32).reshape(7, 6)
    size = whole.shape[dim]
    parts = [(whole.narrow(dim, start, stop - start), tuple(start if d == dim else 0 for d in range(2)))
             for start, stop in _cuts(size, saved)]
    for start, stop in _cuts(size, loaded):
        target = torch.full_like(whole.narrow(dim, start, stop - start), -1.0)
        offset = tuple(start if d == dim else 0 for d in range(2))
        found = sum(shards._copy_overlap(target, offset, part, at) for part, at in parts)
        assert found == target.numel()
        assert torch.equal(target, whole.narrow(dim, start, stop - start))


def test_a_piece_outside_or_of_another_rank_count_copies_nothing() -> None:
    target = torch.zeros(2, 2)
    assert shards._copy_overlap(target, (0, 0), torch.ones(2, 2), (2, 0)) == 0
    assert shards._copy_overlap(target, (0, 0), torch.ones(4), (0,)) == 0
    assert shards._copy_overlap(torch.zeros(()), (), torch.tensor(3.0), ()) == 1
    assert torch.equal(target, torch.zeros(2, 2))


def test_replicated_tensors_are_written_by_rank_0_alone_and_every_rank_records_every_shape() -> None:
    tensors = {"optim.state.w.step": torch.tensor(3.0), "model.w": torch.ones(2, 3)}
    mine, theirs = shards.parts(tensors, rank=0), shards.parts(tensors, rank=1)
    assert mine["tensors"].keys() == {"optim.state.w.step", "model.w"} and theirs["tensors"] == {}
    assert theirs["shapes"] == mine["shapes"] == {"optim.state.w.step": (), "model.w": (2, 3)}
    assert theirs["dtypes"]["model.w"] == torch.float32 and mine["offsets"]["model.w"] == (0, 0)


def test_a_view_into_a_larger_storage_is_written_alone() -> None:
    padded = torch.arange(12.0)
    part = shards.parts({"model.w": padded[:5]}, rank=0)["tensors"]["model.w"]
    assert part.untyped_storage().nbytes() == 5 * 4 and torch.equal(part, padded[:5])
    whole = torch.ones(3, 4)
    assert shards.parts({"model.w": whole}, rank=0)["tensors"]["model.w"] is whole  # no copy


@pytest.fixture
def saved_gpt(one_rank_group: None, tmp_path: Path) -> Iterator[tuple[Path, nn.Module]]:
    model, optimizer = sharded_gpt()
    tensors, plain = split_state(model, optimizer)
    yield write(Snapshot(tmp_path, 1, tensors, {"rng": 1}, {"format": FORMAT, "optim_plain": plain}, 2)), model


def test_an_fsdp_checkpoint_is_one_file_a_rank_and_loads_sharded_plain_and_whole(
        saved_gpt: tuple[Path, nn.Module]) -> None:
    folder, model = saved_gpt
    marker = json.loads((folder / MARKER).read_text())
    assert set(marker["files"]) == {"state.pt", "rank-00000.pt", shard_file(0)} == {"state.pt", "rank-00000.pt",
                                                                                   "shards/tensors-00000.pt"}
    sharded, sharded_optimizer = sharded_gpt()
    with torch.no_grad():
        for p in sharded.parameters():
            p.zero_()
    load_into(folder, checkpoint.load(folder), sharded, sharded_optimizer)
    plain = GPT(vocab=16, block_size=8, dim=16, layers=1, heads=2)
    plain_optimizer = torch.optim.AdamW(plain.parameters(), lr=0.1)
    load_into(folder, checkpoint.load(folder), plain, plain_optimizer)  # as DDP or one process loads it
    whole = read_model(folder)
    for name, value in model.state_dict().items():
        expected = value.full_tensor()
        assert torch.equal(sharded.state_dict()[name].full_tensor(), expected), name
        assert torch.equal(plain.state_dict()[name], expected) and torch.equal(whole[name], expected), name
    assert plain_optimizer.state_dict()["state"][0]["step"] == 1


def test_a_missing_part_or_a_file_of_other_content_is_the_checkpoints_error(saved_gpt: tuple[Path, nn.Module],
                                                                          tmp_path: Path) -> None:
    folder, _ = saved_gpt
    parts = shards.read(folder)
    del parts[0]["tensors"]["model.tok.weight"]
    target = {"model.tok.weight": torch.empty(16, 16)}
    with pytest.raises(CheckpointError, match=r"parts of model.tok.weight hold 0 of the 256 elements.*"
                                              r"HINT: a file of .*shards is missing"):
        shards.fill(folder, parts, target)
    torch.save({"tensors": {}}, folder / shard_file(0))
    with pytest.raises(CheckpointError, match=r"tensors-00000.pt holds \['tensors'\], expected the entries "
                                              r"\['tensors', 'offsets', 'shapes', 'dtypes'\].*HINT: it was not"):
        shards.read(folder)
