"""W&B's arguments: offline, in run_dir, no console capture, unless the environment says otherwise (the real
library, offline: tests/multiproc/test_trackers.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchslurm.train.tracker_wandb import init_arguments


def _arguments(environ: dict[str, str], tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    return init_arguments(project="mnist", name="3-lr=0.01", group="lr", run_id="0123456789abcdef",
                          run_dir=tmp_path, params={"lr": 0.01}, environ=environ)


def test_a_run_is_offline_in_its_run_dir_and_resumable_by_its_id(tmp_path: Path) -> None:
    arguments, settings = _arguments({}, tmp_path)
    assert arguments == {"project": "mnist", "name": "3-lr=0.01", "group": "lr", "id": "0123456789abcdef",
                         "resume": "allow", "job_type": "train", "config": {"lr": 0.01}, "reinit": "create_new",
                         "dir": str(tmp_path), "mode": "offline"}
    assert settings == {"console": "off"}


def test_the_users_variables_win(tmp_path: Path) -> None:
    arguments, settings = _arguments({"WANDB_MODE": "online", "WANDB_DIR": "/scratch/wandb",
                                      "WANDB_CONSOLE": "wrap"}, tmp_path)
    assert "mode" not in arguments and "dir" not in arguments and settings == {}
