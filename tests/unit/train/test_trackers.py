"""The trackers' pure parts (settings, names, ids, what is sent again) and their thread, with a fake tracker
standing for a library (the real ones, offline: tests/multiproc/test_trackers.py)."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from torchslurm.errors import ConfigError
from torchslurm.train import trackers
from torchslurm.train.config import TrainConfig, build
from torchslurm.train.metrics import MetricsLog
from torchslurm.train.trackers import (
    STATE_FILE,
    Trackers,
    TrackerSettings,
    default_mlflow_uri,
    installed_problem,
    is_new,
    outcome,
    outputs,
    read_state,
    run_names,
    run_trackers,
    values_of,
    wandb_run_id,
)

SWEEP = {"TORCHSLURM_SWEEP": "lr-seed", "TORCHSLURM_SWEEP_POINT": "3-lr=0.01,seed=1"}


# ---- settings -----------------------------------------------------------------------------------
def test_the_settings_default_to_no_tracker_and_take_a_comma_list() -> None:
    assert (TrainConfig().trackers, TrainConfig().tracker_project, TrainConfig().mlflow_uri) == ("", "torchslurm", "")
    _, cfg = build({"trackers": "wandb, mlflow", "mlflow_uri": "http://127.0.0.1:5000"})
    assert run_trackers(cfg.to_dict(), {}) is not None
    assert run_trackers(TrainConfig().to_dict(), {}) is None


@pytest.mark.parametrize(("values", "message"), [
    ({"trackers": "wandbb"}, r"trackers='wandbb' is not one of wandb, mlflow\. HINT: e\.g\. trackers=wandb"),
    ({"trackers": "wandb,tensorboard"}, r"trackers='tensorboard' is not one of wandb, mlflow\. HINT: TensorBoard "
                                        r"event files are always written"),
    ({"trackers": "mlflow,mlflow"}, r"trackers='mlflow,mlflow' names a tracker twice\."),
    ({"tracker_project": "team/mnist"}, r"tracker_project='team/mnist' contains /; expected a W&B project"),
    ({"tracker_project": " "}, r"tracker_project=' ' is empty"),
    ({"mlflow_uri": "mlruns"}, r"mlflow_uri='mlruns' is a path, not a tracking URI\. HINT: a local store is a "
                               r"SQLite file: mlflow_uri=sqlite:////\S+/mlruns/mlflow\.db"),
])
def test_bad_settings_are_refused_with_a_hint(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build(values)


@pytest.mark.parametrize("uri", ["sqlite:///runs/mlflow.db", "http://127.0.0.1:5000", "file:///tmp/mlruns",
                                 "databricks", "postgresql://u@h/db"])
def test_tracking_uris_are_taken_as_given(uri: str) -> None:
    assert TrainConfig(mlflow_uri=uri).mlflow_uri == uri


def test_a_tracker_not_installed_names_the_extra_to_install() -> None:
    absent = {"wandb", "sqlalchemy"}

    def find(module: str) -> object | None:
        return None if module in absent else object()

    problem = installed_problem("wandb,mlflow", "", find=find)
    assert problem is not None and problem.message == (
        "trackers='wandb,mlflow', but this Python (wandb needs wandb; mlflow needs sqlalchemy) does not have it "
        "installed.")
    assert problem.hint == "pip install 'torchslurm[wandb,mlflow]' where the ranks run, or drop it from trackers."
    # a tracking server needs no SQL store here; nothing configured needs nothing
    assert installed_problem("mlflow", "http://127.0.0.1:5000", find=find) is None
    assert installed_problem("", "", find=lambda module: None) is None


# ---- names and ids ----------------------------------------------------------------------------
def test_a_sweep_point_is_named_after_its_folder_and_grouped_by_the_sweep(tmp_path: Path) -> None:
    names = run_names("mnist", tmp_path / "runs" / "lr-seed" / "3-lr=0.01,seed=1", SWEEP)
    assert (names.project, names.experiment, names.name, names.group) == (
        "mnist", "mnist/lr-seed", "3-lr=0.01,seed=1", "lr-seed")
    alone = run_names("mnist", tmp_path / "runs" / "demo", {})
    assert (alone.experiment, alone.name, alone.group) == ("mnist", "demo", None)


def test_the_wandb_id_is_derived_from_the_run_dir_and_its_first_start(tmp_path: Path) -> None:
    one = wandb_run_id(tmp_path / "a", 1700000000.25)
    assert re.fullmatch(r"[0-9a-f]{16}", one)
    assert one == wandb_run_id(tmp_path / "a", 1700000000.25)
    assert one not in (wandb_run_id(tmp_path / "b", 1700000000.25), wandb_run_id(tmp_path / "a", 1700000001.25))


def test_the_default_mlflow_store_is_beside_the_run_dir(tmp_path: Path) -> None:
    assert default_mlflow_uri(tmp_path / "sweep" / "0-lr=1") == f"sqlite:///{tmp_path / 'sweep' / 'mlflow.db'}"


def test_the_outputs_say_where_each_run_is_kept_and_how_to_look_at_it(tmp_path: Path) -> None:
    config = TrainConfig(trackers="wandb,mlflow", run_dir=tmp_path / "demo").to_dict()
    uri = default_mlflow_uri(tmp_path / "demo")
    assert outputs(config, {}) == [
        ("wandb", f"{tmp_path / 'demo' / 'wandb'}  (upload: wandb sync {tmp_path / 'demo' / 'wandb'}/offline-run-*)"),
        ("mlflow", f"{uri}  (mlflow ui --backend-store-uri {uri})")]
    assert [name for name, _ in outputs(config, {"WANDB_MODE": "online"})] == ["mlflow"]  # W&B has it online
    assert outputs(TrainConfig().to_dict(), {}) == []


def test_what_a_tracker_already_took_is_not_sent_again() -> None:
    logged = {"step": 100, "epoch": 104}
    assert not is_new({"kind": "step", "step": 100}, logged) and is_new({"kind": "step", "step": 120}, logged)
    assert not is_new({"kind": "epoch", "step": 104}, logged)
    assert is_new({"kind": "epoch", "step": 100}, {"step": 100})  # a kind of its own: an epoch's end after a stop


def test_a_record_becomes_tensorboards_names_and_its_epoch() -> None:
    record = {"kind": "step", "epoch": 2, "step": 60, "loss": 0.5, "named": [{"rank": 1}], "stragglers": 0}
    assert values_of(record) == {"step/loss": 0.5, "step/stragglers": 0.0, "epoch": 2.0}


def test_how_a_run_ended() -> None:
    assert [outcome(False, 3, 3), outcome(False, 2, 3), outcome(True, 3, 3)] == ["completed", "stopped", "failed"]


# ---- the thread ---------------------------------------------------------------------------------
class FakeTracker:
    """Records what the thread asks of a library; `fail` names the call that raises."""

    def __init__(self, name: str, calls: list[tuple[Any, ...]], fail: str = "", new_id: str = "") -> None:
        self.name, self.calls, self.fail, self.new_id = name, calls, fail, new_id

    def _call(self, *what: Any) -> None:
        self.calls.append((self.name, *what))
        if what[0] == self.fail:
            raise OSError(28, "No space left on device")

    def start(self, run_id: str | None) -> str:
        self._call("start", run_id)
        return self.new_id or run_id or f"{self.name}-new"  # new_id: the store lost run_id

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self._call("log", step, dict(values))

    def finish(self, state: str) -> None:
        self._call("finish", state)


def _trackers(run_dir: Path, calls: list[tuple[Any, ...]], fail: Mapping[str, str] | None = None,
              new_ids: Mapping[str, str] | None = None, clock: float = 1700000000.5, **config: Any) -> Trackers:
    cfg = TrainConfig(**{"trackers": "wandb,mlflow", "run_dir": run_dir, "epochs": 2, **config})
    settings = TrackerSettings.of(cfg.to_dict(), SWEEP)
    return Trackers(settings, clock=lambda: clock, open_one=lambda name, _s, _t: FakeTracker(
        name, calls, (fail or {}).get(name, ""), (new_ids or {}).get(name, "")))


def _epoch(epoch: int, step: int) -> dict[str, Any]:
    return {"kind": "epoch", "epoch": epoch, "step": step, "val_loss": 1.0 / epoch}


def _run(trackers: Trackers, records: list[dict[str, Any]], failed: bool = False) -> None:
    trackers.start()
    for record in records:
        trackers.write(record)
    trackers.close(failed)


def test_records_reach_every_tracker_and_the_runs_are_kept_in_the_run_dir(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    _run(_trackers(tmp_path, calls), [{"kind": "step", "epoch": 1, "step": 5, "loss": 0.5}, _epoch(1, 10),
                                      _epoch(2, 20)])
    assert [c for c in calls if c[0] == "wandb"] == [
        ("wandb", "start", None), ("wandb", "log", 5, {"step/loss": 0.5, "epoch": 1.0}),
        ("wandb", "log", 10, {"epoch/val_loss": 1.0, "epoch": 1.0}),
        ("wandb", "log", 20, {"epoch/val_loss": 0.5, "epoch": 2.0}), ("wandb", "finish", "completed")]
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert state["wandb"] == {"run_id": "wandb-new", "logged": {"step": 5, "epoch": 20}}
    assert state["mlflow"]["uri"] == default_mlflow_uri(tmp_path) and state["epochs_logged"] == 2


def test_a_resume_continues_the_runs_without_sending_the_redone_steps_again(tmp_path: Path) -> None:
    first: list[tuple[Any, ...]] = []
    _run(_trackers(tmp_path, first), [_epoch(1, 10), {"kind": "step", "epoch": 2, "step": 15, "loss": 0.2}])
    assert ("mlflow", "finish", "stopped") in first  # a stop before the last epoch: it may be resumed
    again: list[tuple[Any, ...]] = []  # resumed from epoch 1's checkpoint (step 10): step 15 is re-done
    _run(_trackers(tmp_path, again, clock=1800000000.0), [
        {"kind": "step", "epoch": 2, "step": 15, "loss": 0.2}, _epoch(2, 20)])
    assert [c for c in again if c[0] == "mlflow"] == [
        ("mlflow", "start", "mlflow-new"), ("mlflow", "log", 20, {"epoch/val_loss": 0.5, "epoch": 2.0}),
        ("mlflow", "finish", "completed")]
    assert read_state(tmp_path)["started"] == 1700000000.5  # the W&B id's derivation is kept too


def test_resume_never_begins_new_runs_and_a_lost_run_is_sent_everything(tmp_path: Path) -> None:
    _run(_trackers(tmp_path, []), [_epoch(1, 10)])
    calls: list[tuple[Any, ...]] = []
    _run(_trackers(tmp_path, calls, clock=1800000000.0, resume="never"), [_epoch(1, 10)])
    assert ("wandb", "start", None) in calls and ("wandb", "log", 10, {"epoch/val_loss": 1.0, "epoch": 1.0}) in calls
    assert read_state(tmp_path)["started"] == 1800000000.0
    lost: list[tuple[Any, ...]] = []  # the store no longer has the run: a new one, which has nothing yet
    _run(_trackers(tmp_path, lost, new_ids={"mlflow": "other"}, clock=1800000000.0), [_epoch(1, 10)])
    assert ("mlflow", "log", 10, {"epoch/val_loss": 1.0, "epoch": 1.0}) in lost


def test_another_mlflow_store_gets_a_run_of_its_own(tmp_path: Path) -> None:
    _run(_trackers(tmp_path, []), [_epoch(1, 10)])
    calls: list[tuple[Any, ...]] = []
    _run(_trackers(tmp_path, calls, mlflow_uri="http://127.0.0.1:5000"), [])
    assert ("mlflow", "start", None) in calls and ("wandb", "start", "wandb-new") in calls


@pytest.mark.parametrize("fail", ["start", "log", "finish"])
def test_a_failing_tracker_is_warned_about_once_and_the_others_go_on(
        tmp_path: Path, fail: str, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[tuple[Any, ...]] = []
    with caplog.at_level(logging.WARNING, logger="torchslurm.train.trackers"):
        _run(_trackers(tmp_path, calls, fail={"mlflow": fail}), [_epoch(1, 10), _epoch(2, 20)])
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and re.match(
        r"mlflow tracker could not \w+ (its run|step 10) \(training goes on; mlflow is off for the rest of this run\): "
        r"OSError: \[Errno 28\] No space left on device", warnings[0]), warnings
    assert len([c for c in calls if c[0] == "mlflow" and c[1] == fail]) == 1  # never asked again
    assert ("wandb", "finish", "completed") in calls


def test_a_failed_fit_ends_the_runs_as_failed_through_the_metrics_log(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    log = MetricsLog(tmp_path / "metrics.jsonl", trackers=_trackers(tmp_path, calls))
    with pytest.raises(RuntimeError), log:
        log.append(_epoch(1, 10))
        raise RuntimeError("a rank died")
    assert ("wandb", "log", 10, {"epoch/val_loss": 1.0, "epoch": 1.0}) in calls
    assert ("wandb", "finish", "failed") in calls and ("mlflow", "finish", "failed") in calls


def test_nothing_starts_before_fit_and_a_corrupt_state_file_means_new_runs(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    trackers = _trackers(tmp_path, calls)
    trackers.write(_epoch(1, 10))
    trackers.close()
    assert calls == [] and not (tmp_path / STATE_FILE).exists()
    (tmp_path / STATE_FILE).write_text('{"version": 1, "started": "yesterday"}')
    assert read_state(tmp_path) == {}
    (tmp_path / STATE_FILE).write_text('{"version": 1, "started": 1.5, "epochs_logged": 2, "wandb": {"run_id": "a"}, '
                                       '"mlflow": {"run_id": "b", "logged": {"epoch": 3}}}')
    assert read_state(tmp_path) == {"version": 1, "started": 1.5, "epochs_logged": 2,
                                    "mlflow": {"run_id": "b", "logged": {"epoch": 3}}}
    (tmp_path / STATE_FILE).write_text("[]")
    _run(trackers, [])
    assert ("wandb", "start", None) in calls


def test_a_tracker_that_hangs_holds_up_neither_the_other_nor_the_end_for_long(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(trackers, "WAIT_S", {"completed": 0.2, "stopped": 0.2, "failed": 0.2})
    release, calls = threading.Event(), list[tuple[Any, ...]]()

    class Hanging(FakeTracker):
        def start(self, run_id: str | None) -> str:
            release.wait()  # a tracking server that does not answer
            return super().start(run_id)

    def open_one(name: str, _settings: TrackerSettings, _started: float) -> FakeTracker:
        return (Hanging if name == "mlflow" else FakeTracker)(name, calls)

    cfg = TrainConfig(trackers="wandb,mlflow", run_dir=tmp_path, epochs=1)
    feeds = Trackers(TrackerSettings.of(cfg.to_dict(), {}), open_one=open_one)
    try:
        with caplog.at_level(logging.WARNING, logger="torchslurm.train.trackers"):
            _run(feeds, [_epoch(1, 10)])
        assert calls == [("wandb", "start", None), ("wandb", "log", 10, {"epoch/val_loss": 1.0, "epoch": 1.0}),
                         ("wandb", "finish", "completed")]
        assert [r.getMessage() for r in caplog.records] == [
            "mlflow did not finish its run within 0.2 s; the run ends without waiting longer (what it had not "
            "written is lost)"]
    finally:
        release.set()
