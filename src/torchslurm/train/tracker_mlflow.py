"""An MLflow run for the Trainer's records (train.trackers owns when and what), through MlflowClient:
no global active run, so a run of the user's own in this process is left alone.

The default store is a SQLite file shared by every run beside run_dir (a sweep's points): its
tables are created by whoever opens it first, under a lock file beside it (MLflow locks only
within one node). The experiment is found or created by name, which the store keeps unique: two
points starting at once end in the same one. A run id continues where the store still has it.
The parameters (the TrainConfig) are logged when the run begins: MLflow refuses to change a
parameter, so a resumed run with other settings keeps the first ones.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from torchslurm.runtime.safefiles import open_append

__all__ = ["STATUS", "MlflowTracker", "run_tags", "sqlite_file"]

STATUS = {"completed": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}
"""MLflow's run status for each way a run ends; a requeued run is RUNNING again when it resumes."""


def sqlite_file(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI; None for other stores."""
    return Path(uri[len("sqlite:///"):].split("?", 1)[0]) if uri.startswith("sqlite:///") else None


def run_tags(group: str | None, run_dir: Path) -> dict[str, str]:
    """What a run is tagged with besides its name: its run_dir and its sweep."""
    return {"torchslurm.run_dir": str(Path(run_dir).absolute()), **({"torchslurm.sweep": group} if group else {})}


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Held while a SQLite store is opened (its tables may be created then) by one process at a time,
    across nodes where the file system has locks. Other stores: nothing to hold."""
    database = sqlite_file(uri)
    if database is None:
        yield
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    with open_append(database.with_name(database.name + ".lock")) as lock:
        with suppress(OSError):  # a file system without locks: MLflow's own, within this node, remains
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        yield


class MlflowTracker:
    """train.trackers.Tracker for MLflow."""

    def __init__(self, *, uri: str, experiment: str, name: str, group: str | None, run_dir: Path,
                 params: Mapping[str, Any]) -> None:
        self.uri, self.experiment, self.name, self.group, self.run_dir = uri, experiment, name, group, run_dir
        self.params = {k: str(v)[:6000] for k, v in params.items()}  # MLflow's limit on a value's length
        self._client: Any = None
        self._run_id = ""

    def start(self, run_id: str | None) -> str:
        from mlflow.tracking import MlflowClient

        with store_lock(self.uri):
            self._client = MlflowClient(tracking_uri=self.uri)
            experiment_id = self._experiment_id()
        if run_id and self._exists(run_id):
            self._client.update_run(run_id, status="RUNNING")
            self._run_id = run_id
            return run_id
        run = self._client.create_run(experiment_id, run_name=self.name, tags=run_tags(self.group, self.run_dir))
        self._run_id = run.info.run_id
        from mlflow.entities import Param

        self._client.log_batch(self._run_id, params=[Param(k, v) for k, v in self.params.items()])
        return self._run_id

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        found = self._client.get_experiment_by_name(self.experiment)
        if found is None:
            try:
                return str(self._client.create_experiment(self.experiment))
            except MlflowException:  # another run created it meanwhile
                found = self._client.get_experiment_by_name(self.experiment)
                if found is None:
                    raise
        if found.lifecycle_stage == "deleted":
            raise RuntimeError(f"MLflow experiment {self.experiment!r} is deleted in {self.uri}: restore it "
                               f"(mlflow experiments restore --experiment-id {found.experiment_id}) or set "
                               "tracker_project")
        return str(found.experiment_id)

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            return bool(self._client.get_run(run_id).info.lifecycle_stage != "deleted")
        except MlflowException:
            return False

    def log(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        self._client.log_batch(self._run_id, metrics=[Metric(k, v, now_ms, step) for k, v in values.items()])

    def finish(self, state: str) -> None:
        self._client.set_terminated(self._run_id, status=STATUS[state])
