"""`torchslurm export RUN_DIR OUT`: one plain state_dict file from a run's checkpoint, or an error naming
what was given."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchslurm.cli import main

SHARDS = Path(__file__).parents[2] / "fixtures" / "checkpoints" / "format2-shards"


def test_export_writes_the_newest_checkpoints_weights_and_says_how_to_load_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(SHARDS), str(tmp_path / "model.pt")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {tmp_path / 'model.pt'}: 2 tensors, 0.0 MiB, from {SHARDS / 'step-000000002'} "
                          "(step 2)\n")
    assert "model.load_state_dict(torch.load(" in out
    assert sorted(torch.load(tmp_path / "model.pt", weights_only=True)) == ["bias", "weight"]


def test_export_of_a_folder_without_checkpoints_is_an_error_with_a_hint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(tmp_path), str(tmp_path / "model.pt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path} holds no complete checkpoint") and "HINT: pass the run_dir" in err
    assert not (tmp_path / "model.pt").exists()
