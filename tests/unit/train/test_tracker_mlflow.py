"""MLflow's pure parts and the lock around opening a SQLite store (the real library on a SQLite store:
tests/multiproc/test_trackers.py)."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from torchslurm.train.tracker_mlflow import STATUS, run_tags, sqlite_file, store_lock


def test_the_database_file_of_a_sqlite_uri() -> None:
    assert sqlite_file("sqlite:////abs/runs/mlflow.db") == Path("/abs/runs/mlflow.db")
    assert sqlite_file("sqlite:///rel/mlflow.db?timeout=30") == Path("rel/mlflow.db")
    assert sqlite_file("http://127.0.0.1:5000") is None


def test_a_run_is_tagged_with_its_run_dir_and_sweep(tmp_path: Path) -> None:
    assert run_tags("lr", tmp_path / "a") == {"torchslurm.run_dir": str(tmp_path / "a"), "torchslurm.sweep": "lr"}
    assert run_tags(None, tmp_path) == {"torchslurm.run_dir": str(tmp_path)}
    assert STATUS == {"completed": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}


def test_opening_a_sqlite_store_holds_a_lock_beside_it(tmp_path: Path) -> None:
    database = tmp_path / "new" / "mlflow.db"
    with store_lock(f"sqlite:///{database}"), open(database.with_name("mlflow.db.lock")) as other, \
            pytest.raises(BlockingIOError):  # another process (here: another open file) waits
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(database.with_name("mlflow.db.lock")) as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    with store_lock("http://127.0.0.1:5000"):
        pass
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["mlflow.db.lock", "new"]
