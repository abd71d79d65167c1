"""Random streams captured and put back: python, numpy and torch draw the same numbers again."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from torchslurm.train.rng import rng_state, seed_everything, set_rng_state


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_a_captured_state_draws_the_same_numbers_again_after_a_checkpoint_file(tmp_path: Path) -> None:
    seed_everything(5)
    _draws()
    state = rng_state()
    expected = _draws()
    torch.save(state, tmp_path / "rng.pt")  # as a checkpoint stores it, loaded as a checkpoint loads it
    seed_everything(99)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert _draws() == expected


def test_seeding_fixes_every_stream_and_different_seeds_differ() -> None:
    seed_everything(1)
    first = _draws()
    seed_everything(1)
    assert _draws() == first
    seed_everything(2)
    assert _draws() != first


def test_deterministic_turns_torchs_deterministic_algorithms_on_and_fixes_cublas_workspace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from torchslurm.train.rng import make_repeatable

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        make_repeatable(False)
        assert not torch.are_deterministic_algorithms_enabled()
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        make_repeatable(True)
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        make_repeatable(True)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # the user's own setting stays
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
