"""Model and optimizer state split for a checkpoint and loaded back, however the model is spread now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.unit.train.checkpoint.conftest import sharded_gpt
from torch import nn
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from torchslurm.errors import CheckpointError
from torchslurm.train import checkpoint
from torchslurm.train.checkpoint import integrity
from torchslurm.train.checkpoint.layout import FORMAT, MARKER
from torchslurm.train.checkpoint.state import (
    _FLAT,
    _plain_state_dict,
    load_into,
    quiet_alone,
    read_model,
    split_state,
    stage,
)
from torchslurm.train.checkpoint.writer import Snapshot, write
from torchslurm.train.models import GPT


def _trained_linear() -> tuple[nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_replicated_checkpoint_round_trip_without_a_process_group(tmp_path: Path) -> None:
    """Replicated tensors (DDP, one process) go into one tensors.pt by rank 0, not through DCP."""
    model, optimizer = _trained_linear()
    tensors, plain = split_state(model, optimizer)
    state = {"format": FORMAT, "optim_plain": plain}
    folder = write(Snapshot(tmp_path, 1, stage(tensors), {"rng": 1}, state, keep_last=2))
    marker = json.loads((folder / MARKER).read_text())
    assert set(marker["files"]) == {"state.pt", "rank-00000.pt", "tensors.pt"}
    assert not (folder / "shards").exists()
    other = nn.Linear(3, 2)
    fresh = torch.optim.AdamW(other.parameters(), lr=0.1)
    load_into(folder, checkpoint.load(folder), other, fresh)
    assert torch.equal(other.weight, model.weight) and fresh.state_dict()["state"][0]["step"] == 1
    assert torch.equal(fresh.state_dict()["state"][1]["exp_avg"], optimizer.state_dict()["state"][1]["exp_avg"])
    assert torch.equal(read_model(folder)["bias"], model.bias)
    stored = folder / "tensors.pt"
    stored.write_bytes(stored.read_bytes()[:10])
    with pytest.raises(CheckpointError, match=r"tensors.pt has checksum crc32:.* corrupt or truncated"):
        checkpoint.load(folder)


def test_a_checkpoint_of_another_model_is_refused_with_what_differs(tmp_path: Path) -> None:
    model, optimizer = _trained_linear()
    tensors, plain = split_state(model, optimizer)
    folder = write(Snapshot(tmp_path, 1, tensors, {"rng": 1}, {"format": FORMAT, "optim_plain": plain}, 2))
    wider = nn.Linear(4, 2)
    with pytest.raises(CheckpointError, match=r"another model or optimizer \(other shape: model.weight, "
                                              r"optim.state.weight.exp_avg.*HINT: resume with the model"):
        load_into(folder, checkpoint.load(folder), wider, torch.optim.AdamW(wider.parameters()))
    deeper = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(CheckpointError, match=r"missing: model.0.bias, .*not in the model: model.bias"):
        load_into(folder, checkpoint.load(folder), deeper, torch.optim.AdamW(deeper.parameters()))


def test_checkpoints_whose_replicated_tensors_went_through_dcp_still_load(tmp_path: Path) -> None:
    """Before tensors.pt, rank 0 wrote replicated tensors with DCP into shards/: such checkpoints load."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    model, optimizer = _trained_linear()
    tensors, plain = split_state(model, optimizer)
    folder = write(Snapshot(tmp_path, 1, tensors, {"rng": 1}, {"format": FORMAT, "optim_plain": plain}, 2))
    (folder / "tensors.pt").unlink()
    with quiet_alone():
        dcp_save(tensors, storage_writer=FileSystemWriter(folder / "shards"), no_dist=True)
    files = {str(p.relative_to(folder)): integrity.of_file(p, integrity.Crc32()) for p in folder.rglob("*")
             if p.is_file() and p.name != MARKER}
    (folder / MARKER).write_text(json.dumps({"step": 1, "format": FORMAT, "files": files}))
    other = nn.Linear(3, 2)
    fresh = torch.optim.AdamW(other.parameters(), lr=0.1)
    load_into(folder, checkpoint.load(folder), other, fresh)
    assert torch.equal(other.weight, model.weight) and fresh.state_dict()["state"][0]["step"] == 1
    assert torch.equal(read_model(folder)["weight"], model.weight)


def _trained(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor) -> None:
    model(inputs).float().sum().backward()
    optimizer.step()


@pytest.mark.parametrize("case", ["adamw groups + batchnorm", "sgd momentum", "sgd plain", "no step yet", "gpt"])
def test_split_state_of_a_plain_module_equals_dcps_get_state_dict(case: str) -> None:
    """split_state builds a plain module's state itself (DCP's get_state_dict is slow): it must be
    exactly what get_state_dict gives, since loading goes through set_state_dict."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    inputs: torch.Tensor = torch.randn(4, 3)
    model: nn.Module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    if case == "gpt":
        model, inputs = GPT(vocab=16, block_size=8, dim=16, layers=1, heads=2), torch.zeros(2, 8, dtype=torch.long)
    if case == "adamw groups + batchnorm":
        params = list(model.parameters())
        optimizer: torch.optim.Optimizer = torch.optim.AdamW([{"params": params[:2], "lr": 0.1},
                                                              {"params": params[2:], "lr": 0.2}])
    elif case == "sgd plain":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    elif case in ("sgd momentum", "no step yet"):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    if case != "no step yet":
        _trained(model, optimizer, inputs)
    ours = _plain_state_dict(model, optimizer)
    if case in ("no step yet", "sgd plain"):  # no optimizer state (yet): left to DCP, which creates it
        assert not optimizer.state and ours is None
        return
    assert ours is not None
    theirs = get_state_dict(model, optimizer, options=_FLAT)
    for mine, reference in zip(ours, theirs, strict=True):
        assert list(mine) == list(reference)
        for key, value in reference.items():
            if isinstance(value, torch.Tensor):  # the live tensors, not copies
                assert torch.equal(mine[key], value) and mine[key].data_ptr() == value.data_ptr(), key
            else:
                assert mine[key] == value, key


def test_split_state_of_an_fsdp2_module_equals_dcps_get_state_dict(one_rank_group: None) -> None:
    """fully_shard renames nothing: the direct path holds the same DTensors (the live local shards) under
    the same names as get_state_dict."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import DTensor

    model, optimizer = sharded_gpt()
    ours = _plain_state_dict(model, optimizer)
    assert ours is not None
    for mine, reference in zip(ours, get_state_dict(model, optimizer, options=_FLAT), strict=True):
        assert list(mine) == list(reference)
        for key, value in reference.items():
            if isinstance(value, DTensor):
                assert isinstance(mine[key], DTensor) and mine[key].placements == value.placements, key
                assert mine[key].to_local().data_ptr() == value.to_local().data_ptr(), key
            elif isinstance(value, torch.Tensor):
                assert mine[key].data_ptr() == value.data_ptr(), key
            else:
                assert mine[key] == value, key


def test_split_state_of_a_ddp_module_equals_dcps_get_state_dict(one_rank_group: None) -> None:
    """DDP's state is its module's, under the module's names: the direct path holds the same live
    tensors under the same names as get_state_dict."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    _trained(model, optimizer, torch.randn(4, 3))
    ours = _plain_state_dict(model, optimizer)
    assert ours is not None and "0.weight" in ours[0] and "state.2.bias.exp_avg" in ours[1]
    for mine, reference in zip(ours, get_state_dict(model, optimizer, options=_FLAT), strict=True):
        assert list(mine) == list(reference)
        for key, value in reference.items():
            if isinstance(value, torch.Tensor):
                assert mine[key].data_ptr() == value.data_ptr(), key
            else:
                assert mine[key] == value, key


def test_split_state_leaves_wrapped_and_tied_modules_to_dcp() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)
            self.b.weight = self.a.weight

    tied = Tied()
    assert _plain_state_dict(tied, torch.optim.SGD(tied.parameters(), lr=0.1)) is None
    compiled_like = nn.Module()
    compiled_like._orig_mod = nn.Linear(2, 2)  # torch.compile's wrapper names its module so
    assert _plain_state_dict(compiled_like, torch.optim.SGD(compiled_like.parameters(), lr=0.1)) is None


def test_a_sharded_checkpoint_of_another_model_is_refused_with_what_differs(tmp_path: Path) -> None:
    """Read from DCP's metadata before loading: the same message and hint as for tensors.pt."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    model, optimizer = _trained_linear()
    tensors, plain = split_state(model, optimizer)
    folder = write(Snapshot(tmp_path, 1, tensors, {"rng": 1}, {"format": FORMAT, "optim_plain": plain}, 2))
    (folder / "tensors.pt").unlink()
    with quiet_alone():
        dcp_save(tensors, storage_writer=FileSystemWriter(folder / "shards"), no_dist=True)
    wider = nn.Linear(4, 2)
    with pytest.raises(CheckpointError, match=r"another model or optimizer \(other shape: model.weight, "
                                              r"optim.state.weight.exp_avg.*HINT: resume with the model"):
        load_into(folder, {"optim_plain": plain}, wider, torch.optim.AdamW(wider.parameters()))
