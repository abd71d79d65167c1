"""`torchslurm results DIR`: one row per run of a sweep, or of a folder of run_dirs, from each run's
metrics.jsonl and the state its point is in. Torch-free; it only reads files, and the states come
from the caller (a sweep's from `jobs.sweepstate`, which may ask Slurm).

Read while the runs write: a half-written last line, a run with no metrics yet, a point whose
folder does not exist yet are what a running sweep looks like, not errors.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torchslurm.errors import ConfigError, SlurmError
from torchslurm.jobs import sweepstate
from torchslurm.jobs.slurm import SlurmClient
from torchslurm.jobs.table import Cell

METRICS_FILE = "metrics.jsonl"
"""The Trainer's log in its run_dir: one JSON record per line (train/metrics.py writes it)."""
HIGHER_IS_BETTER = ("accuracy", "acc", "f1", "auc", "precision", "recall")
"""Validation metrics whose best value is the largest; every other one (loss, perplexity) is best smallest."""
TIME_COLUMN = "train_time_s"
"""The sum of the kept epoch records' epoch_time_s: training time over every attempt of a resumed run
(start-up, validation, checkpoints and the work a preemption threw away are not in it)."""
_STEP_PREFIX = '{"kind": "step"'  # how MetricsLog writes a step record: skipped unparsed, a long run has many


@dataclass(frozen=True)
class RunMetrics:
    """What a run's metrics.jsonl says: its epoch records, as they stand now."""

    epochs: tuple[Mapping[str, float], ...] = ()
    """The epoch records (numbers only), in epoch order; an epoch done again after a resume replaces
    the record of its first try."""
    unread: int = 0
    """Lines that are not a JSON object: a half-written last line while the run writes, a damaged file."""

    @property
    def epochs_done(self) -> int:
        return int(self.epochs[-1].get("epoch", len(self.epochs))) if self.epochs else 0

    def names(self) -> list[str]:
        """Its validation metrics (`loss`, `accuracy`, ...): each `val_X` that has a `train_X` beside it
        (`val_samples` counts samples, it is no metric); loss first."""
        found = dict.fromkeys(key[4:] for record in self.epochs for key in record
                              if key.startswith("val_") and f"train_{key[4:]}" in record)
        return sorted(found, key=lambda name: name != "loss")

    def curve(self, name: str) -> list[tuple[float, float]]:
        """(epoch, val_<name>) of every epoch that has it."""
        return [(r["epoch"], r[f"val_{name}"]) for r in self.epochs if f"val_{name}" in r]  # every record has one

    def best(self, name: str) -> float | None:
        values = [v for _, v in self.curve(name) if math.isfinite(v)]
        if not values:
            return self.final(name)  # nan (diverged) or None
        return max(values) if name.lower() in HIGHER_IS_BETTER else min(values)

    def final(self, name: str) -> float | None:
        curve = self.curve(name)
        return curve[-1][1] if curve else None

    @property
    def train_time_s(self) -> float | None:
        times = [r["epoch_time_s"] for r in self.epochs if "epoch_time_s" in r]
        return sum(times) if times else None


def epoch_records(lines: Iterable[str]) -> RunMetrics:
    """The epoch records of metrics.jsonl's lines. The Trainer keeps the file consistent when a run
    resumes (records after the checkpoint it resumes from are dropped); should a record for an
    epoch appear again anyway, the later one wins and the ones after the earlier are dropped too."""
    kept: list[dict[str, float]] = []
    unread = 0
    for line in lines:
        if not line.strip() or line.startswith(_STEP_PREFIX):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            unread += 1
            continue
        if not isinstance(record, dict):
            unread += 1
            continue
        numbers = {k: float(v) for k, v in record.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)}
        if record.get("kind") != "epoch" or "epoch" not in numbers:
            continue
        while kept and kept[-1]["epoch"] >= numbers["epoch"]:
            kept.pop()
        kept.append(numbers)
    return RunMetrics(tuple(kept), unread)


def read_metrics(run_dir: Path) -> RunMetrics:
    """`run_dir`'s metrics as they stand; nothing (no error) where there is no file yet."""
    try:
        with open(run_dir / METRICS_FILE, "rb") as f:
            return epoch_records(line.decode("utf-8", "replace") for line in f)
    except (FileNotFoundError, NotADirectoryError):
        return RunMetrics()
    except OSError as exc:
        raise ConfigError(f"{run_dir / METRICS_FILE} cannot be read: {exc.strerror}.",
                          "check the file's permissions (results reads every run's metrics).") from exc


@dataclass(frozen=True)
class Point:
    """One row: a sweep's point or a run_dir of a folder."""

    name: str
    """The point's index in its sweep, or the run_dir's folder name."""
    run_dir: Path
    overrides: Mapping[str, Cell]
    state: str
    """completed, running, pending, failed, not started or unknown (the words of `jobs.sweepstate`)."""
    reason: str
    metrics: RunMetrics


@dataclass(frozen=True)
class Results:
    """Every run of a sweep (`sweep` its name) or of a folder of run_dirs (`sweep` None)."""

    directory: Path
    sweep: str | None
    keys: tuple[str, ...]
    """The swept keys (a folder of run_dirs: the `key=value` pairs its folder names hold, if any), as
    columns: one named as a column of results (`state`, `epochs_done`, ...) is `swept_<key>`."""
    points: tuple[Point, ...]
    notes: tuple[str, ...] = field(default=())
    """What the table cannot say in its cells: where the states came from, lines not read."""

    @property
    def name_column(self) -> str:
        return "point" if self.sweep is not None else "run"

    def metric_names(self) -> list[str]:
        found: dict[str, None] = {}
        for point in self.points:
            found.update(dict.fromkeys(point.metrics.names()))
        return sorted(found, key=lambda name: name != "loss")

    def columns(self) -> list[str]:
        metrics = [f"{which}_val_{name}" for name in self.metric_names() for which in ("best", "final")]
        return [self.name_column, *self.keys, "state", "epochs_done", *metrics, TIME_COLUMN, "reason"]

    def rows(self) -> list[dict[str, Cell]]:
        return [self._row(p) for p in self.points]

    def _row(self, point: Point) -> dict[str, Cell]:
        name: Cell = int(point.name) if self.sweep is not None and point.name.isdigit() else point.name
        row: dict[str, Cell] = {self.name_column: name, **{k: point.overrides.get(k) for k in self.keys},
                                "state": point.state, "epochs_done": point.metrics.epochs_done}
        for metric in self.metric_names():
            row[f"best_val_{metric}"] = point.metrics.best(metric)
            row[f"final_val_{metric}"] = point.metrics.final(metric)
        row[TIME_COLUMN] = point.metrics.train_time_s
        row["reason"] = point.reason or None
        row["run_dir"] = str(point.run_dir)
        return row


RESERVED = frozenset({"point", "run", "state", "epochs_done", TIME_COLUMN, "reason", "run_dir"})
"""Columns of results that a swept key's column must not shadow."""


def key_column(key: str) -> str:
    """A swept key's column: the key, or `swept_<key>` where results has a column of that name."""
    clash = key in RESERVED or key.startswith(("best_val_", "final_val_", "swept_"))
    return f"swept_{key}" if clash else key


# ---- a folder of run_dirs -------------------------------------------------------------------
_SETTING = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([^,]*)")
_INDEX = re.compile(r"([0-9]+)-(.*)")


def settings_of_name(name: str) -> dict[str, Cell]:
    """The `key=value` pairs a run_dir's name holds (`lr=0.1,seed=2`, a sweep point's `3-lr=0.1`);
    {} for another name. Values that read as numbers are numbers."""
    match = _INDEX.fullmatch(name)
    body = match.group(2) if match else name
    parts = body.split(",")
    pairs = [_SETTING.fullmatch(p) for p in parts]
    if not body or not all(pairs):
        return {}
    return {m.group(1): _value(m.group(2)) for m in pairs if m}


def _value(text: str) -> Cell:
    for kind in (int, float):
        try:
            return kind(text)  # type: ignore[no-any-return]
        except ValueError:
            pass
    return text


def _run_order(path: Path) -> tuple[float, str]:
    match = _INDEX.fullmatch(path.name)
    return (int(match.group(1)) if match else math.inf, path.name)


def run_dirs(directory: Path) -> list[Path]:
    """The run_dirs of a folder: itself if it holds a metrics.jsonl, else its sub-folders that do,
    ordered by a leading index (`3-lr=0.1`), then by name."""
    if (directory / METRICS_FILE).is_file():
        return [directory]
    try:
        children = [c for c in directory.iterdir() if c.is_dir() and (c / METRICS_FILE).is_file()]
    except OSError as exc:
        raise ConfigError(f"{directory} cannot be listed: {exc.strerror}.", "check the folder's permissions.") from exc
    return sorted(children, key=_run_order)


def run_state(run_dir: Path) -> tuple[str, str]:
    """A run outside a sweep: its state and reason from its outcome.json alone (no job to ask Slurm about)."""
    outcome = sweepstate.read_outcome(run_dir)
    if outcome is None:
        return sweepstate.UNKNOWN, f"no {sweepstate.OUTCOME_FILE}: running, killed, or not a Trainer's run"
    return sweepstate.outcome_state(outcome)


def folder_results(directory: Path) -> Results:
    """One row per run_dir of `directory` (see `run_dirs`), each in the state its outcome.json says."""
    found = run_dirs(directory)
    if not found:
        raise ConfigError(f"{directory} holds no run: no {sweepstate.MANIFEST_FILE}, no {METRICS_FILE} in it or in "
                          "a folder right under it.", _no_runs_hint(directory))
    settings = {d: {key_column(k): v for k, v in settings_of_name(d.name).items()} if d != directory else {}
                for d in found}
    keys = tuple(dict.fromkeys(k for s in settings.values() for k in s))
    points = tuple(Point(d.name, d, settings[d], *run_state(d), read_metrics(d)) for d in found)
    return Results(directory=directory, sweep=None, keys=keys, points=points,
                   notes=(f"states from each run's {sweepstate.OUTCOME_FILE} (not a sweep: Slurm was not asked)",
                          *_unread_notes(points)))


def _no_runs_hint(directory: Path) -> str:
    """(`run_dirs` has just listed `directory`.)"""
    sweeps = sorted(c.name for c in directory.iterdir() if (c / sweepstate.MANIFEST_FILE).is_file())
    if sweeps:
        return f"it holds sweeps: `torchslurm results {directory / sweeps[0]}`" + (
            f" (and {', '.join(sweeps[1:4])}{', ...' if len(sweeps) > 4 else ''})" if len(sweeps) > 1 else "") + "."
    return ("give a sweep's folder (the one with sweep.json), a run_dir (the one with metrics.jsonl), "
            "or a folder of run_dirs.")


def _unread_notes(points: Sequence[Point]) -> tuple[str, ...]:
    return tuple(f"{p.run_dir / METRICS_FILE}: {p.metrics.unread} line(s) not read (a line being written, "
                 "or not JSON)" for p in points if p.metrics.unread)


def sweep_results(directory: Path, manifest: sweepstate.Manifest,
                  states: Sequence[sweepstate.PointState], notes: Sequence[str] = ()) -> Results:
    """One row per point of a sweep, in the states `jobs.sweepstate` decided; `directory` is where
    the sweep is now (it may have been copied away from the `sweep_dir` its manifest names)."""
    keys = tuple(dict.fromkeys(key_column(k) for p in manifest.points for k in p.overrides))
    points = tuple(Point(str(s.index), directory / s.dir, {key_column(k): _cell(v) for k, v in s.overrides.items()},
                         s.state, s.reason, read_metrics(directory / s.dir)) for s in states)
    return Results(directory=directory, sweep=manifest.name, keys=keys, points=points,
                   notes=(*notes, *_unread_notes(points)))


def collect(directory: Path, client: SlurmClient | None) -> Results:
    """The results of a sweep's folder (the one with sweep.json) or of a folder of run_dirs. A
    sweep's states ask Slurm through `client` (None: not asked) and fall back to the runs'
    outcome.json where Slurm cannot answer (no Slurm here, a copied folder)."""
    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a folder{'' if directory.exists() else ' (it does not exist)'}.",
                          "give a sweep's folder (<run_dir>/<sweep name>, the one with sweep.json), or a folder "
                          "of run_dirs.")
    manifest = sweepstate.read_manifest(directory)
    if manifest is None:
        return folder_results(directory)
    manifest = replace(manifest, sweep_dir=directory)
    tasks, notes = _tasks(manifest, client)
    states = sweepstate.point_states(manifest, sweepstate.read_outcomes(manifest), tasks)
    if notes:  # not asked, or could not be: a point Slurm would know of shows as unknown
        states = [replace(s, reason=f"no {sweepstate.OUTCOME_FILE} yet: running, or killed (Slurm was not asked)")
                  if s.state == sweepstate.UNKNOWN else s for s in states]
    return sweep_results(directory, manifest, states, notes)


def _tasks(manifest: sweepstate.Manifest, client: SlurmClient | None
           ) -> tuple[dict[int, sweepstate.TaskView], list[str]]:
    """Slurm's view of the sweep's tasks, and a note when Slurm was not (or could not be) asked."""
    if not manifest.submissions:
        return {}, []
    if client is None:
        return {}, [f"Slurm was not asked (--no-slurm): states come from each point's {sweepstate.OUTCOME_FILE}; "
                    "a point still queued or running shows as unknown"]
    try:
        return sweepstate.slurm_tasks(manifest, client), []
    except SlurmError as exc:
        return {}, [f"Slurm could not be asked ({exc.message.removesuffix('.')}): states come from each point's "
                    f"{sweepstate.OUTCOME_FILE}; a point still queued or running shows as unknown"]


def _cell(value: Any) -> Cell:
    """An override as a cell: numbers, strings and booleans as they are, anything else as its JSON."""
    if value is None or isinstance(value, str | int | float | bool):
        return value  # type: ignore[no-any-return]
    return json.dumps(value)
