"""Pure parts of the FSDP, task, text and sharded-checkpoint modules (no process group)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from torchslurm.errors import CheckpointError, ConfigError
from torchslurm.train import checkpoint, checksum, dcp, fsdp, tasks, text
from torchslurm.train.config import TrainConfig
from torchslurm.train.metrics import Totals
from torchslurm.train.models import GPT, Block
from torchslurm.train.strategy import make_scaler


def test_units_by_share_look_into_module_lists() -> None:
    model = GPT(layers=3, dim=32, heads=2)
    chosen = fsdp.units(model, min_share=0.1)
    assert [type(m).__name__ for m in chosen] == ["Embedding", "Block", "Block", "Block", "Linear"]
    assert model.ln_f not in chosen and model.pos not in chosen


def test_units_by_class_name_and_an_unknown_name() -> None:
    model = GPT(layers=2, dim=32, heads=2)
    assert fsdp.units(model, ["Block"]) == list(model.blocks)
    with pytest.raises(ConfigError, match=r"fsdp_wrap=Blok: no module of class Blok in GPT; its classes are .*Block"):
        fsdp.units(model, ["Blok"])


def test_fp16_with_fsdp_casts_parameters_to_fp16_and_reduces_in_fp32() -> None:
    assert TrainConfig(amp="fp16", strategy="fsdp").amp == "fp16"
    with pytest.raises(ConfigError, match="strategy='zero'"):
        TrainConfig(strategy="zero")
    policies = [fsdp.mixed_precision(amp) for amp in ("bf16", "fp16")]
    assert [(p.param_dtype, p.reduce_dtype) for p in policies] == [  # type: ignore[attr-defined]
        (torch.bfloat16, torch.float32), (torch.float16, torch.float32)]
    assert fsdp.mixed_precision("off") is None
    with pytest.raises(ConfigError, match=r"amp='fp8' is not one of off, bf16, fp16\. HINT"):
        fsdp.mixed_precision("fp8")
    assert make_scaler("fp16", "cpu").is_enabled() and not make_scaler("bf16", "cpu").is_enabled()


def test_rebind_optimizer_points_at_new_parameters() -> None:
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    model.weight = nn.Parameter(model.weight.detach().clone())  # what fully_shard does to each parameter
    fsdp.rebind_optimizer(optimizer, names, model)
    assert optimizer.param_groups[0]["params"][0] is model.weight


def test_classification_and_language_model_sums() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    sums = tasks.classification().sums(logits, torch.tensor([0, 0, 0]), torch.tensor(0.5))
    assert sums.tolist() == [1.5, 2.0, 3.0]
    lm = tasks.language_model(flops_per_token=10.0)
    sums = lm.sums(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), torch.tensor(2.0))
    assert sums.tolist() == [12.0, 0.0, 6.0]
    assert lm.metrics(Totals(12.0, 0, 6)) == pytest.approx({"loss": 2.0, "perplexity": 7.389056})
    assert lm.summary(Totals(12.0, 0, 6)) == "Avg Loss: 2.000000, Perplexity: 7.389"
    assert tasks.classification().summary(Totals(3.0, 2, 4)) == "Avg Loss: 0.750000, Accuracy: 50.00%"


def test_text_windows_are_next_tokens_and_deterministic() -> None:
    x, y = text.windows(b"abcdefghij", 3)
    assert x.tolist() == [[97, 98, 99], [100, 101, 102], [103, 104, 105]]
    assert y[0].tolist() == [98, 99, 100]
    a, b = text.stdlib_text(block_size=8, max_bytes=4096), text.stdlib_text(block_size=8, max_bytes=4096)
    assert torch.equal(a[0].tensors[0], b[0].tensors[0])
    with pytest.raises(ConfigError, match="block_size=1"):
        text.windows(b"abc", 1)


def test_gpt_logits_shape_and_flops() -> None:
    model = GPT(block_size=8, dim=16, layers=1, heads=2)
    assert model(torch.zeros(2, 8, dtype=torch.long)).shape == (2, 8, 256)
    assert model.flops_per_token() > 6 * sum(p.numel() for p in Block(16, 2).parameters())


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
    tensors, plain = dcp.split_state(model, optimizer)
    state = {"format": dcp.FORMAT, "optim_plain": plain}
    folder = dcp.write(dcp.Snapshot(tmp_path, 1, dcp.stage(tensors), {"rng": 1}, state, keep_last=2))
    marker = json.loads((folder / checkpoint.MARKER).read_text())
    assert set(marker["files"]) == {"state.pt", "rank-00000.pt", "tensors.pt"}
    assert not (folder / "shards").exists()
    other = nn.Linear(3, 2)
    fresh = torch.optim.AdamW(other.parameters(), lr=0.1)
    dcp.load_into(folder, checkpoint.load(folder), other, fresh)
    assert torch.equal(other.weight, model.weight) and fresh.state_dict()["state"][0]["step"] == 1
    assert torch.equal(fresh.state_dict()["state"][1]["exp_avg"], optimizer.state_dict()["state"][1]["exp_avg"])
    assert torch.equal(dcp.read_model(folder)["bias"], model.bias)
    stored = folder / "tensors.pt"
    stored.write_bytes(stored.read_bytes()[:10])
    with pytest.raises(CheckpointError, match=r"tensors.pt has checksum crc32:.* corrupt or truncated"):
        checkpoint.load(folder)


def test_a_checkpoint_of_another_model_is_refused_with_what_differs(tmp_path: Path) -> None:
    model, optimizer = _trained_linear()
    tensors, plain = dcp.split_state(model, optimizer)
    folder = dcp.write(dcp.Snapshot(tmp_path, 1, tensors, {"rng": 1}, {"format": dcp.FORMAT, "optim_plain": plain}, 2))
    wider = nn.Linear(4, 2)
    with pytest.raises(CheckpointError, match=r"another model or optimizer \(other shape: model.weight, "
                                              r"optim.state.weight.exp_avg.*HINT: resume with the model"):
        dcp.load_into(folder, checkpoint.load(folder), wider, torch.optim.AdamW(wider.parameters()))
    deeper = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(CheckpointError, match=r"missing: model.0.bias, .*not in the model: model.bias"):
        dcp.load_into(folder, checkpoint.load(folder), deeper, torch.optim.AdamW(deeper.parameters()))


def test_checkpoints_whose_replicated_tensors_went_through_dcp_still_load(tmp_path: Path) -> None:
    """Before tensors.pt, rank 0 wrote replicated tensors with DCP into shards/: such checkpoints load."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    model, optimizer = _trained_linear()
    tensors, plain = dcp.split_state(model, optimizer)
    folder = dcp.write(dcp.Snapshot(tmp_path, 1, tensors, {"rng": 1}, {"format": dcp.FORMAT, "optim_plain": plain}, 2))
    (folder / "tensors.pt").unlink()
    with dcp._quiet_alone():
        dcp.dcp_save(tensors, storage_writer=FileSystemWriter(folder / "shards"), no_dist=True)
    files = {str(p.relative_to(folder)): checksum.of_file(p, checksum.Crc32()) for p in folder.rglob("*")
             if p.is_file() and p.name != checkpoint.MARKER}
    (folder / checkpoint.MARKER).write_text(json.dumps({"step": 1, "format": dcp.FORMAT, "files": files}))
    other = nn.Linear(3, 2)
    fresh = torch.optim.AdamW(other.parameters(), lr=0.1)
    dcp.load_into(folder, checkpoint.load(folder), other, fresh)
    assert torch.equal(other.weight, model.weight) and fresh.state_dict()["state"][0]["step"] == 1
    assert torch.equal(dcp.read_model(folder)["weight"], model.weight)


def test_checksums_taken_while_writing_are_those_of_the_files_on_disk(tmp_path: Path) -> None:
    """Large tensors are checksummed on a helper thread while written, small writes inline: either
    way COMPLETE lists every file of the folder with the CRC-32 of its bytes as read back."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 3))  # a 4 MiB weight: the threaded path
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 1024)).sum().backward()
    optimizer.step()
    tensors, plain = dcp.split_state(model, optimizer)
    folder = dcp.write(dcp.Snapshot(tmp_path, 3, tensors, {"rng": 1}, {"format": dcp.FORMAT, "optim_plain": plain},
                                    keep_last=2))
    files = json.loads((folder / checkpoint.MARKER).read_text())["files"]
    on_disk = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} - {checkpoint.MARKER}
    assert set(files) == on_disk
    assert files == {name: checksum.of_file(folder / name, checksum.Crc32()) for name in on_disk}
    assert (folder / "tensors.pt").stat().st_size > 3 * 4 << 20  # weights and 2 moments


def test_background_staging_reuses_its_buffers_and_copies(tmp_path: Path) -> None:
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    writer = dcp.Writer()
    tensors, plain = dcp.split_state(model, optimizer)
    first = writer.stage(tensors)
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on: the staged copy must not see it
    assert not torch.equal(first["model.weight"], model.weight)
    writer.start(dcp.Snapshot(tmp_path, 1, first, {"rng": 1}, {"format": dcp.FORMAT, "optim_plain": plain}, 2))
    second = writer.stage(dcp.split_state(model, optimizer)[0])  # waits for the save reading `first`
    assert torch.equal(second["model.weight"], model.weight)
    assert second["model.weight"].data_ptr() == first["model.weight"].data_ptr()  # the same memory, refilled
    assert writer.wait() == checkpoint.step_dir(tmp_path, 1)
    assert not torch.equal(dcp.read_model(checkpoint.step_dir(tmp_path, 1))["weight"], model.weight)


def _linear_snapshot(root: Path, step: int, keep_last: int) -> tuple[dcp.Snapshot, nn.Linear]:
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    tensors, plain = dcp.split_state(model, optimizer)
    state = {"format": dcp.FORMAT, "optim_plain": plain}
    return dcp.Snapshot(root, step, tensors, {"rng": 1}, state, keep_last), model


def _steps(root: Path) -> list[int]:
    return [step for step, _ in checkpoint.complete(root)]


def test_a_save_on_the_training_thread_keeps_the_previous_checkpoint_until_the_run_ends(tmp_path: Path) -> None:
    """keep_last=1: a new checkpoint's files are fsynced after it is published, so the one before it
    stays until the next save has joined that fsync; finish() then leaves keep_last."""
    writer = dcp.Writer()
    for step in (1, 2, 3):
        writer.save(_linear_snapshot(tmp_path, step, keep_last=1)[0])
    checkpoint.wait_for_deletes()
    assert _steps(tmp_path) == [2, 3]
    writer.finish(tmp_path, keep_last=1)
    checkpoint.wait_for_deletes()
    assert _steps(tmp_path) == [3]
    checkpoint.load(checkpoint.step_dir(tmp_path, 3))  # checksums as recorded


def test_the_fsync_thread_syncs_every_file_and_folder_of_the_checkpoint(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    writer = dcp.Writer()
    folder = writer.save(_linear_snapshot(tmp_path, 4, keep_last=2)[0])
    writer.wait()
    files = {str(p) for p in folder.rglob("*")} | {str(folder), str(tmp_path)}
    assert set(synced) == files  # each once: the tensors, rank and state files, COMPLETE, the folder, the root
    assert len(synced) == len(files)


def test_a_failed_fsync_is_an_error_on_the_training_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    writer = dcp.Writer()
    monkeypatch.setattr(os, "fsync", failing_fsync)
    writer.save(_linear_snapshot(tmp_path, 1, keep_last=2)[0])
    with pytest.raises(CheckpointError, match=r"could not be written to disk: .*Input/output error.*HINT: check free"):
        writer.wait()


def test_markers_with_sha256_checksums_still_verify(tmp_path: Path) -> None:
    """Sharded checkpoints written before CRC-32 record sha256 digests: they load, and a corrupt file
    among them is still found."""
    folder = dcp.write(_linear_snapshot(tmp_path, 1, keep_last=2)[0])
    marker_file = folder / checkpoint.MARKER
    marker = json.loads(marker_file.read_text())
    marker["files"] = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in marker["files"]}
    marker_file.write_text(json.dumps(marker))
    checkpoint.load(folder)
    (folder / dcp.rank_file(0)).write_bytes(b"junk")
    with pytest.raises(CheckpointError, match=r"rank-00000.pt has checksum [0-9a-f]{12}.* corrupt"):
        checkpoint.load(folder)


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
    ours = dcp._plain_state_dict(model, optimizer)
    if case in ("no step yet", "sgd plain"):  # no optimizer state (yet): left to DCP, which creates it
        assert not optimizer.state and ours is None
        return
    assert ours is not None
    theirs = get_state_dict(model, optimizer, options=dcp._FLAT)
    for mine, reference in zip(ours, theirs, strict=True):
        assert list(mine) == list(reference)
        for key, value in reference.items():
            if isinstance(value, torch.Tensor):  # the live tensors, not copies
                assert torch.equal(mine[key], value) and mine[key].data_ptr() == value.data_ptr(), key
            else:
                assert mine[key] == value, key


def test_split_state_leaves_wrapped_and_tied_modules_to_dcp() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)
            self.b.weight = self.a.weight

    tied = Tied()
    assert dcp._plain_state_dict(tied, torch.optim.SGD(tied.parameters(), lr=0.1)) is None
    compiled_like = nn.Module()
    compiled_like._orig_mod = nn.Linear(2, 2)  # torch.compile's wrapper names its module so
    assert dcp._plain_state_dict(compiled_like, torch.optim.SGD(compiled_like.parameters(), lr=0.1)) is None


def test_metadata_reader_refuses_other_objects(tmp_path: Path) -> None:
    (tmp_path / ".metadata").write_bytes(pickle.dumps(io.StringIO("x")))
    with pytest.raises(CheckpointError, match=r"_io.StringIO is not allowed in checkpoint metadata"):
        dcp.SafeReader(tmp_path).read_metadata()
