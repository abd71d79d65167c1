"""A run's weights back out in one process, without a process group: into a plain model (load_model) or
one plain state_dict file (export), from every layout (format 1, tensors.pt, FSDP's shards)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

import torchslurm
from torchslurm.errors import CheckpointError
from torchslurm.train.checkpoint import complete
from torchslurm.train.checkpoint.weights import export, load_model

FIXTURES = Path(__file__).parents[3] / "fixtures" / "checkpoints"
LAYOUTS = ["format1", "format2-shards", "format2-tensors"]


def _expected(name: str) -> dict[str, object]:
    return json.loads((FIXTURES / name / "expected.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_loads_into_a_plain_model_in_one_process(name: str) -> None:
    model = nn.Linear(3, 2)
    loaded = torchslurm.load_model(model, FIXTURES / name)  # the checkpoints folder: its newest
    expected = _expected(name)
    assert model.weight.tolist() == expected["weight"] and model.bias.tolist() == expected["bias"]
    assert (loaded.folder.name, loaded.step, loaded.missing, loaded.skipped) == ("step-000000002", 2, (), ())
    assert not torch.distributed.is_initialized()


def test_a_run_dir_gives_its_newest_verified_checkpoint_and_a_step_folder_itself(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "format2-tensors", run / "checkpoints", ignore=shutil.ignore_patterns("*.json"))
    newer = run / "checkpoints" / "step-000000005"
    shutil.copytree(run / "checkpoints" / "step-000000002", newer)
    (newer / "tensors.pt").write_bytes(b"torn")  # its checksum no longer matches
    with caplog.at_level(logging.WARNING):
        loaded = load_model(nn.Linear(3, 2), run)
    assert loaded.folder.name == "step-000000002" and "skipping corrupt checkpoint" in caplog.text
    with pytest.raises(CheckpointError, match=r"tensors.pt has checksum"):
        load_model(nn.Linear(3, 2), newer)  # named: verified, not skipped
    step_two = run / "checkpoints" / "step-000000002"
    assert load_model(nn.Linear(3, 2), step_two / "state.pt").folder == step_two


def test_another_model_is_refused_strictly_and_loads_what_matches_otherwise() -> None:
    with pytest.raises(CheckpointError, match=r"holds the weights of another model \(missing: 0.bias, 0.weight; not "
                                              r"in the model: bias, weight\)\. HINT: build Sequential as it was "
                                              r"trained .* or pass strict=False"):
        load_model(nn.Sequential(nn.Linear(3, 2)), FIXTURES / "format2-shards")
    with pytest.raises(CheckpointError, match=r"other shape: bias \(saved \(2,\), model \(5,\)\), weight \(saved "
                                              r"\(2, 3\), model \(5, 3\)\)\)"):
        load_model(nn.Linear(3, 5), FIXTURES / "format2-shards")
    new_head = nn.Linear(3, 5)
    untouched = new_head.weight.detach().clone()
    loaded = load_model(new_head, FIXTURES / "format2-shards", strict=False)
    assert (loaded.missing, loaded.skipped) == (("bias", "weight"), ("bias", "weight"))
    assert torch.equal(new_head.weight, untouched)


def test_export_writes_one_plain_state_dict_file(tmp_path: Path) -> None:
    folder, step, _ = export(FIXTURES / "format2-shards", tmp_path / "out" / "model.pt")
    plain = torch.load(tmp_path / "out" / "model.pt", weights_only=True)
    assert sorted(plain) == ["bias", "weight"] and step == 2 and folder.name == "step-000000002"
    assert plain["weight"].tolist() == _expected("format2-shards")["weight"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["model.pt"]  # no partial file left
    with pytest.raises(CheckpointError, match=r"is a directory; expected the path of the file to write"):
        export(FIXTURES / "format2-shards", tmp_path)


def test_a_path_without_a_checkpoint_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"nowhere does not exist\. HINT: pass a run_dir"):
        load_model(nn.Linear(3, 2), tmp_path / "nowhere")
    (tmp_path / "checkpoints").mkdir()
    assert complete(tmp_path / "checkpoints") == []
    with pytest.raises(CheckpointError, match=r"holds no complete checkpoint \(no step-N folder with a COMPLETE "):
        load_model(nn.Linear(3, 2), tmp_path)
