"""Weights & Biases and MLflow runs fed with the records of metrics.jsonl, from rank 0, off the training path.

`trackers=wandb,mlflow` (TrainConfig) sends every record MetricsLog appends — step records and epoch records,
the numbers TensorBoard gets, named the same (`step/loss`, `epoch/val_loss`) — to a run of each library. The
libraries are imported only then, on rank 0, each in a thread of its own that owns it: importing wandb and
mlflow, starting W&B's service process and opening MLflow's store take seconds that no rank waits for.

A run keeps its tracker runs across requeues: `run_dir/trackers.json` holds their ids and, per kind of
record, the step of the last one each tracker took. A resumed run re-does the steps after its checkpoint;
their records are not sent again (neither library can take a point back: W&B refuses a step below its
last, MLflow would keep both), so a tracker keeps the first attempt's points, equal to the re-done ones
but for timings (the resume is bitwise). `resume=never` starts new tracker runs, as it starts training over.

A tracker is never worth the run: one that fails (disk full, server down) is warned about once and left
out for the rest of the run; training goes on. Only a configured library that is not installed stops a
run, before any rank trains (`installed_problem`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torchslurm.errors import ConfigError, not_one_of, shown
from torchslurm.runtime.safefiles import replace
from torchslurm.train.events import scalars_of

__all__ = ["STATE_FILE", "TRACKERS", "Tracker", "TrackerSettings", "Trackers", "installed_problem", "run_trackers"]

logger = logging.getLogger(__name__)

TRACKERS = ("wandb", "mlflow")
"""The trackers `trackers=` may name."""
STATE_FILE = "trackers.json"
"""In run_dir: the tracker runs this run_dir feeds, and what each has taken (see the module's docstring)."""
MLFLOW_DB = "mlflow.db"
"""The default MLflow store: this SQLite file beside run_dir, shared by the runs (and sweep points) there."""
SWEEP_VARIABLE, POINT_VARIABLE = "TORCHSLURM_SWEEP", "TORCHSLURM_SWEEP_POINT"
"""What a sweep's array task exports: the sweep's name and its point's folder name."""
WAIT_S = {"completed": 60.0, "stopped": 10.0, "failed": 10.0}
"""How long the end of fit waits for the trackers to finish their runs: longer after the last epoch than
after a stop or failure, when a requeue waits for rank 0 within the job's grace time."""

_MODULES = {"wandb": ("wandb",), "mlflow": ("mlflow",)}
_SQLITE_MODULES = ("sqlalchemy", "alembic")  # MLflow's SQL store, beyond mlflow-skinny
_BAD_PROJECT = set("/\\#?%:")  # W&B refuses these in a project name


def parse_trackers(text: str) -> tuple[str, ...]:
    """`"wandb, mlflow"` -> ("wandb", "mlflow"); names as written, checked by `trackers_problem`."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def trackers_problem(text: str) -> ConfigError | None:
    """`trackers` names each known tracker at most once."""
    names = parse_trackers(text)
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        hint = ("TensorBoard event files are always written (run_dir/tensorboard); " if "tensorboard" in unknown
                else "") + f"e.g. trackers=wandb or trackers={','.join(TRACKERS)} ('' for none)."
        return not_one_of("trackers", unknown[0], TRACKERS, hint)
    if len(set(names)) != len(names):
        return ConfigError(f"trackers={shown(text)} names a tracker twice.", f"e.g. trackers={','.join(TRACKERS)}.")
    return None


def project_problem(project: str) -> ConfigError | None:
    """`tracker_project`: a W&B project name (MLflow takes any experiment name)."""
    bad = sorted(_BAD_PROJECT & set(project))
    if project.strip() and not bad and len(project) <= 128:
        return None
    what = f"contains {' '.join(bad)}" if bad else ("is empty" if not project.strip() else "is over 128 characters")
    return ConfigError(f"tracker_project={shown(project)} {what}; expected a W&B project / MLflow experiment name "
                       "(at most 128 characters, none of / \\ # ? % :).", "e.g. tracker_project=mnist-sweeps.")


def mlflow_uri_problem(uri: str) -> ConfigError | None:
    """`mlflow_uri`: empty (the default store) or a URI: MLflow reads a bare path as its folder store, which
    recent MLflow refuses (MLFLOW_ALLOW_FILE_STORE) — a database file is what a bare path most likely meant."""
    if not uri or "://" in uri or uri.startswith(("file:", "databricks")):
        return None
    return ConfigError(f"mlflow_uri={shown(uri)} is a path, not a tracking URI.",
                       f"a local store is a SQLite file: mlflow_uri=sqlite:///{Path(uri).absolute() / MLFLOW_DB}; "
                       "a server: mlflow_uri=http://host:5000; empty: run_dir's parent/mlflow.db.")


def default_mlflow_uri(run_dir: Path) -> str:
    """One SQLite store beside run_dir: the runs of one base folder, a sweep's points, in one place."""
    return f"sqlite:///{Path(run_dir).absolute().parent / MLFLOW_DB}"


def installed_problem(trackers: str, mlflow_uri: str, *,
                      find: Callable[[str], object | None] = importlib.util.find_spec) -> ConfigError | None:
    """A configured tracker whose library is not installed (found without importing it): checked on every
    rank before training, and by `torchslurm train` before the ranks start."""
    missing = {}
    for name in parse_trackers(trackers):
        sqlite = name == "mlflow" and (not mlflow_uri or mlflow_uri.startswith("sqlite:"))
        wanted = (*_MODULES.get(name, ()), *(_SQLITE_MODULES if sqlite else ()))
        if absent := [module for module in wanted if find(module) is None]:
            missing[name] = absent
    if not missing:
        return None
    listed = "; ".join(f"{name} needs {', '.join(modules)}" for name, modules in missing.items())
    extras = ",".join(missing)
    return ConfigError(f"trackers={shown(trackers)}, but this Python ({listed}) does not have it installed.",
                       f"pip install 'torchslurm[{extras}]' where the ranks run, or drop it from trackers.")


@dataclass(frozen=True)
class RunNames:
    """Where a run shows up in the trackers."""

    project: str
    """W&B project."""
    experiment: str
    """MLflow experiment: the project, or `<project>/<sweep>` for a sweep's points."""
    name: str
    """Run name: the sweep point's folder name, else run_dir's name."""
    group: str | None
    """The sweep's name (W&B group, MLflow tag `torchslurm.sweep`), None outside a sweep."""


def run_names(project: str, run_dir: Path, environ: Mapping[str, str]) -> RunNames:
    sweep = environ.get(SWEEP_VARIABLE) or None
    name = environ.get(POINT_VARIABLE) or Path(run_dir).absolute().name
    return RunNames(project, f"{project}/{sweep}" if sweep else project, name, sweep)


def wandb_run_id(run_dir: Path, started: float) -> str:
    """The W&B run id of the tracker runs begun at `started` for `run_dir`: the same for every attempt
    of the run, another after `resume=never` or in another folder."""
    return hashlib.sha256(f"{Path(run_dir).absolute()}\n{started!r}".encode()).hexdigest()[:16]


def is_new(record: Mapping[str, Any], logged: Mapping[str, int]) -> bool:
    """Whether a tracker that took, per kind of record, the records up to `logged[kind]` lacks `record`."""
    return int(record.get("step", 0)) > logged.get(str(record.get("kind", "")), -1)


def values_of(record: Mapping[str, Any]) -> dict[str, float]:
    """A record's numbers as tracker metrics: TensorBoard's names, and the epoch to plot against."""
    values = scalars_of(record)
    if isinstance(record.get("epoch"), int):
        values["epoch"] = float(record["epoch"])
    return values


def outcome(failed: bool, epochs_logged: int, epochs: int) -> str:
    """completed | stopped (preempted or asked to stop: it may be resumed) | failed."""
    return "failed" if failed else "completed" if epochs_logged >= epochs else "stopped"


@dataclass(frozen=True)
class TrackerSettings:
    """What the trackers need of a TrainConfig (its `to_dict()`), and the launch's environment."""

    trackers: tuple[str, ...]
    names: RunNames
    run_dir: Path
    mlflow_uri: str
    fresh: bool
    """resume=never: new tracker runs, whatever run_dir holds."""
    epochs: int
    params: Mapping[str, Any]
    environ: Mapping[str, str]

    @classmethod
    def of(cls, config: Mapping[str, Any], environ: Mapping[str, str]) -> TrackerSettings:
        run_dir = Path(config["run_dir"])
        return cls(parse_trackers(config["trackers"]), run_names(config["tracker_project"], run_dir, environ),
                   run_dir, config["mlflow_uri"] or default_mlflow_uri(run_dir), config["resume"] == "never",
                   int(config["epochs"]), dict(config), environ)


class Tracker(Protocol):
    """One library's run (train.tracker_wandb, train.tracker_mlflow); every call may raise."""

    def start(self, run_id: str | None) -> str:
        """Continue run `run_id`, or begin a run when None (or when the store no longer has it); its id."""

    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def finish(self, state: str) -> None:
        """End the run as completed, stopped or failed (see `outcome`)."""


def open_tracker(name: str, settings: TrackerSettings, started: float) -> Tracker:
    """The tracker `name` for these settings (its library is imported at its start)."""
    names, run_dir = settings.names, settings.run_dir
    if name == "wandb":
        from torchslurm.train.tracker_wandb import WandbTracker

        return WandbTracker(project=names.project, name=names.name, group=names.group,
                            run_id=wandb_run_id(run_dir, started), run_dir=run_dir, params=settings.params,
                            environ=settings.environ)
    from torchslurm.train.tracker_mlflow import MlflowTracker

    return MlflowTracker(uri=settings.mlflow_uri, experiment=names.experiment, name=names.name, group=names.group,
                         run_dir=run_dir, params=settings.params)


def read_state(run_dir: Path) -> dict[str, Any]:
    """run_dir's STATE_FILE, or {} when there is none or it is not one (new tracker runs then); an entry
    of a tracker that is not whole is left out (a new run for that tracker)."""
    try:
        state = json.loads((Path(run_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not (isinstance(state, dict) and state.get("version") == 1 and isinstance(state.get("started"), float)
            and type(state.get("epochs_logged")) is int):
        return {}
    for name in TRACKERS:
        entry = state.get(name)
        whole = isinstance(entry, dict) and isinstance(entry.get("run_id"), str) and isinstance(
            entry.get("logged"), dict) and all(type(step) is int for step in entry["logged"].values())
        if not whole:
            state.pop(name, None)
    return state


class Trackers:
    """Rank 0's tracker runs, fed by MetricsLog: `start()` at the start of fit, `write(record)` per record,
    `close(failed)` at its end. Every call returns at once but close, which waits a little (WAIT_S) for the
    runs to be finished. Each tracker has a thread of its own, which does the rest in order: a slow one
    (a tracking server that retries) holds up neither training nor the other."""

    def __init__(self, settings: TrackerSettings, *,
                 open_one: Callable[[str, TrackerSettings, float], Tracker] = open_tracker,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings, self._open, self._clock = settings, open_one, clock
        self._feeds: dict[str, tuple[queue.SimpleQueue[tuple[str, Any]], threading.Thread]] = {}
        self._lock = threading.Lock()  # over _state, which the threads update and save
        self._state: dict[str, Any] = {}

    def start(self) -> None:
        if self._feeds:
            return
        s = self.settings
        with self._lock:
            self._state = ({} if s.fresh else read_state(s.run_dir)) or {
                "version": 1, "started": self._clock(), "epochs_logged": 0}
            self._save()  # before any run exists: its W&B id is derived from `started`
        for name in s.trackers:
            feed: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
            feed.put(("start", None))
            thread = threading.Thread(target=self._work, args=(name, feed), daemon=True, name=f"torchslurm-{name}")
            thread.start()
            self._feeds[name] = (feed, thread)

    def write(self, record: Mapping[str, Any]) -> None:
        if not self._feeds:
            return
        if record.get("kind") == "epoch":
            with self._lock:
                self._state["epochs_logged"] = max(int(self._state["epochs_logged"]), int(record.get("epoch", 0)))
                self._save()
        for feed, _ in self._feeds.values():
            feed.put(("log", dict(record)))

    def close(self, failed: bool = False) -> None:
        """Finish the runs; wait for that up to WAIT_S (a thread still busy goes on, and ends with the process)."""
        feeds, self._feeds = self._feeds, {}
        if not feeds:
            return
        with self._lock:
            state = outcome(failed, int(self._state["epochs_logged"]), self.settings.epochs)
        for feed, _ in feeds.values():
            feed.put(("finish", state))
        deadline = time.monotonic() + WAIT_S[state]
        for _, thread in feeds.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        if late := [name for name, (_, thread) in feeds.items() if thread.is_alive()]:
            logger.warning("%s did not finish its run within %g s; the run ends without waiting longer (what it had "
                           "not written is lost)", " and ".join(late), WAIT_S[state])

    # ---- a tracker's thread -----------------------------------------------------------------
    def _work(self, name: str, feed: queue.SimpleQueue[tuple[str, Any]]) -> None:
        tracker: Tracker | None = None
        while True:
            what, arg = feed.get()
            try:
                if what == "start":
                    tracker = self._begin(name)
                elif tracker is not None and what == "log":
                    self._log(name, tracker, arg)
                elif tracker is not None:
                    tracker.finish(arg)
            except Exception as exc:  # never fatal: said once, and this tracker is left out from now on
                if tracker is not None or what == "start":
                    step = f"log step {arg.get('step', 0)}" if what == "log" else f"{what} its run"
                    logger.warning("%s tracker could not %s (training goes on; %s is off for the rest of this run): "
                                   "%s: %s", name, step, name, type(exc).__name__, _first_line(exc))
                tracker = None
            if what == "finish":
                return

    def _begin(self, name: str) -> Tracker:
        s = self.settings
        with self._lock:
            entry, started = dict(self._state.get(name, {})), float(self._state["started"])
        if name == "mlflow" and entry.get("uri") != s.mlflow_uri:
            entry = {}  # a run id of another store
        tracker = self._open(name, s, started)
        run_id = tracker.start(entry.get("run_id"))
        same = run_id == entry.get("run_id")  # else a new run (the store lost the old one): it has nothing yet
        with self._lock:
            self._state[name] = {"run_id": run_id, "logged": dict(entry.get("logged", {})) if same else {},
                                 **({"uri": s.mlflow_uri} if name == "mlflow" else {})}
            self._save()
        return tracker

    def _log(self, name: str, tracker: Tracker, record: Mapping[str, Any]) -> None:
        with self._lock:
            logged = dict(self._state[name]["logged"])
        if not is_new(record, logged):
            return
        kind, step = str(record.get("kind", "")), int(record.get("step", 0))
        tracker.log(step, values_of(record))
        with self._lock:
            self._state[name]["logged"][kind] = step
            self._save()

    def _save(self) -> None:
        """Write the state (the lock held)."""
        try:
            replace(self.settings.run_dir / STATE_FILE, json.dumps(self._state, allow_nan=False) + "\n")
        except (OSError, ValueError) as exc:  # a full disk: the trackers may log twice after a resume, no worse
            logger.debug("could not write %s: %s", STATE_FILE, exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def outputs(config: Mapping[str, Any], environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """Where the trackers of `config` (a TrainConfig's `to_dict()`) keep a run, and how to look at it."""
    settings, found = TrackerSettings.of(config, environ), []
    offline = "WANDB_DIR" not in environ and environ.get("WANDB_MODE", "offline") == "offline"
    if "wandb" in settings.trackers and offline:
        folder = settings.run_dir / "wandb"
        found.append(("wandb", f"{folder}  (upload: wandb sync {folder}/offline-run-*)"))
    if "mlflow" in settings.trackers:
        uri = settings.mlflow_uri
        found.append(("mlflow", f"{uri}  (mlflow ui --backend-store-uri {uri})"))
    return found


def run_trackers(config: Mapping[str, Any], environ: Mapping[str, str]) -> Trackers | None:
    """The trackers `config` (a TrainConfig's `to_dict()`) asks for; None without any."""
    settings = TrackerSettings.of(config, environ)
    return Trackers(settings) if settings.trackers else None

