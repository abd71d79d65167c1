"""W&B and MLflow for real, offline: a sweep point trained on 2 Gloo ranks with trackers=wandb,mlflow, then
resumed from an older checkpoint; what each library stored is read back and compared with metrics.jsonl.

Nothing here reaches a network: W&B runs offline (WANDB_MODE) with its error reporting off, MLflow's store
is a SQLite file under tmp_path (the default, beside run_dir) with its telemetry off.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.multiproc.conftest import clean_environ

from torchslurm.train.trackers import STATE_FILE

pytestmark = [pytest.mark.multiproc,  # MLflow's SQL store on SQLAlchemy 2.1, read back here: not ours to fix
              pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")]

SWEEP, POINT = "lr-sweep", "0-lr=0.05"
COMPARED = ("train_loss", "train_accuracy", "val_loss", "val_accuracy")
"""The epoch metrics a bitwise resume reproduces (timings differ between attempts)."""


def _environ(tmp_path: Path) -> dict[str, str]:
    return clean_environ(
        TORCHSLURM_SWEEP=SWEEP, TORCHSLURM_SWEEP_POINT=POINT,  # as a sweep's array task exports them
        WANDB_MODE="offline", WANDB_SILENT="true", WANDB_ERROR_REPORTING="false", WANDB_X_DISABLE_STATS="true",
        WANDB_DISABLE_GIT="true", WANDB_DISABLE_CODE="true", WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"), WANDB_DATA_DIR=str(tmp_path / "wandb-data"),
        MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true", TORCHSLURM_CHECK_PERIOD_S="0")


def _train(tmp_path: Path, run_dir: Path, *overrides: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "torchslurm", "train", "--nproc", "2", "dataset=synthetic", "log_every=20",
         "trackers=wandb,mlflow", f"run_dir={run_dir}", *overrides],
        capture_output=True, text=True, timeout=300, env=_environ(tmp_path), stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "training goes on" not in result.stdout + result.stderr, result.stderr[-3000:]  # no tracker failed
    return result.stdout


def _wandb_records(path: Path) -> list[Any]:
    """The protocol buffer records of a W&B run file: a 7-byte header (`:W&B`, a key, a version), then
    LevelDB's log format (32 KiB blocks of chunks: CRC-32C, length, type; a record may span blocks)."""
    from wandb.proto import wandb_internal_pb2

    data, records, pending, pos = path.read_bytes(), [], b"", 7
    assert data[:4] == b":W&B", data[:7]
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a record is complete
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _wandb_attempts(run_dir: Path) -> list[dict[str, Any]]:
    """Per offline run folder, in order: the run's id, project, group and name, and its history rows."""
    attempts = []
    for folder in sorted((run_dir / "wandb").glob("offline-run-*")):
        (path,) = folder.glob("run-*.wandb")
        records = _wandb_records(path)
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        rows = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
                for r in records if r.WhichOneof("record_type") == "history"]
        attempts.append({"id": run.run_id, "project": run.project, "group": run.run_group, "name": run.display_name,
                         "rows": rows})
    return attempts


def _left_running(data_dir: Path) -> list[int]:
    """W&B service processes started for this test (their environment names its WANDB_DATA_DIR)."""
    mine = f"WANDB_DATA_DIR={data_dir}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            if b"wandb-core" in (proc / "cmdline").read_bytes() and mine in environ:
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_sweep_point_logs_to_wandb_and_mlflow_offline_and_a_resume_continues_both_runs(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / SWEEP / POINT
    out = _train(tmp_path, run_dir, "epochs=2")
    assert f"  wandb        {run_dir / 'wandb'}  (upload: wandb sync {run_dir / 'wandb'}/offline-run-*)" in out
    first = json.loads((run_dir / STATE_FILE).read_text())
    # Resumed from epoch 1's checkpoint with one more epoch: epoch 2 is re-done, epoch 3 is new.
    oldest = sorted((run_dir / "checkpoints").glob("step-*"))[0]
    _train(tmp_path, run_dir, "epochs=3", f"resume={oldest}")
    state = json.loads((run_dir / STATE_FILE).read_text())
    assert [state[t]["run_id"] for t in ("wandb", "mlflow")] == [first[t]["run_id"] for t in ("wandb", "mlflow")]

    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
              if '"kind": "epoch"' in line]
    assert [r["epoch"] for r in epochs] == [1, 2, 3]
    expected = {r["step"]: {k: r[k] for k in COMPARED} for r in epochs}

    # MLflow: one run in the sweep's experiment, named after the point, every epoch once at its step.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / SWEEP / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"torchslurm/{SWEEP}")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert (run.info.run_id, run.info.run_name, run.info.status) == (state["mlflow"]["run_id"], POINT, "FINISHED")
    assert run.data.tags["torchslurm.sweep"] == SWEEP and run.data.params["epochs"] == "2"  # params: first attempt's
    stored = {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, f"epoch/{key}")}
              for key in COMPARED}
    for key in COMPARED:
        assert len(client.get_metric_history(run.info.run_id, f"epoch/{key}")) == 3  # epoch 2 not twice
    assert {step: {k: stored[k][step] for k in COMPARED} for step in expected} == expected
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "step/loss")]
    assert steps == sorted(set(steps)) and steps  # the re-done steps' records were not sent again

    # W&B: one offline folder per attempt, one run id, grouped by the sweep and named after the point.
    attempts = _wandb_attempts(run_dir)
    assert len(attempts) == 2
    assert {(a["id"], a["project"], a["group"], a["name"]) for a in attempts} == {
        (state["wandb"]["run_id"], "torchslurm", SWEEP, POINT)}
    rows = [row for a in attempts for row in a["rows"]]
    history_steps = [row["_step"] for row in rows]
    assert history_steps == sorted(set(history_steps))  # increasing across the attempts: nothing twice
    logged = {row["_step"]: {k: row[f"epoch/{k}"] for k in COMPARED} for row in rows if "epoch/val_loss" in row}
    assert logged == expected

    deadline = time.monotonic() + 30  # W&B's service ends once the process it served is gone
    while _left_running(tmp_path / "wandb-data") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _left_running(tmp_path / "wandb-data") == []
