"""TensorBoard event files, read back with TensorBoard's own reader (the `tensorboard` package)."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest

from torchslurm.train.events import EventWriter, crc32c, scalars_of
from torchslurm.train.metrics import MetricsLog

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def _read(log_dir: Path) -> Any:
    acc = event_accumulator.EventAccumulator(str(log_dir), purge_orphaned_data=True)
    acc.Reload()
    return acc


def _steps(acc: Any, tag: str) -> list[tuple[int, float]]:
    return [(e.step, round(e.value, 4)) for e in acc.Scalars(tag)]


def test_crc32c_matches_the_standard_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # RFC 3720's CRC-32C check value
    assert crc32c(b"123456789") != zlib.crc32(b"123456789")


def test_metrics_records_become_scalars_tensorboard_reads(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl", EventWriter(tmp_path / "tb"))
    log.append({"kind": "step", "epoch": 1, "step": 10, "loss": 0.5, "lr": 0.1})
    log.append({"kind": "epoch", "epoch": 1, "step": 20, "val_loss": 0.25, "val_accuracy": 0.75, "note": "x"})
    log.close()
    acc = _read(tmp_path / "tb")
    assert set(acc.Tags()["scalars"]) == {"step/loss", "step/lr", "epoch/val_loss", "epoch/val_accuracy"}
    assert _steps(acc, "step/loss") == [(10, 0.5)]
    assert _steps(acc, "epoch/val_accuracy") == [(20, 0.75)]


def test_a_resumed_run_drops_the_events_after_its_checkpoint(tmp_path: Path) -> None:
    first = MetricsLog(tmp_path / "metrics.jsonl", EventWriter(tmp_path / "tb", clock=lambda: 1000.0))
    for step in (1, 2, 3, 4):
        first.append({"kind": "step", "step": step, "loss": 1.0 / step})
    first.close()
    resumed = MetricsLog(tmp_path / "metrics.jsonl", EventWriter(tmp_path / "tb", clock=lambda: 2000.0))
    resumed.keep_until(2)  # the checkpoint was at step 2: steps 3 and 4 are re-done
    for step in (3, 4):
        resumed.append({"kind": "step", "step": step, "loss": 10.0 * step})
    resumed.close()
    assert [r["step"] for r in resumed.records()] == [1, 2, 3, 4]
    assert _steps(_read(tmp_path / "tb"), "step/loss") == [(1, 1.0), (2, 0.5), (3, 30.0), (4, 40.0)]


def test_starting_over_drops_every_earlier_event(tmp_path: Path) -> None:
    old = EventWriter(tmp_path / "tb", clock=lambda: 1000.0)
    old.write({"kind": "step", "step": 5, "loss": 9.0})
    old.close()
    log = MetricsLog(tmp_path / "metrics.jsonl", EventWriter(tmp_path / "tb", clock=lambda: 2000.0))
    log.keep_until(0)
    log.append({"kind": "step", "step": 1, "loss": 1.0})
    log.close()
    assert _steps(_read(tmp_path / "tb"), "step/loss") == [(1, 1.0)]


def test_only_numbers_are_scalars() -> None:
    assert scalars_of({"kind": "epoch", "epoch": 2, "step": 7, "val_loss": 1, "flag": True, "name": "a"}) == {
        "epoch/val_loss": 1.0}
