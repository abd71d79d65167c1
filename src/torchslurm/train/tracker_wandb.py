"""A Weights & Biases run for the Trainer's records (train.trackers owns when and what).

Offline unless the environment says otherwise: no network at run time, the run's files in
`run_dir/wandb/offline-run-*`, uploaded later with `wandb sync`. Every attempt of a requeued run
opens the same run id with resume="allow": offline, each attempt is a folder of its own, and
`wandb sync` of them in order makes one run. A variable the user set (WANDB_MODE, WANDB_DIR,
WANDB_CONSOLE) wins over these defaults: they are passed only where it is absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["WandbTracker", "init_arguments"]


def init_arguments(*, project: str, name: str, group: str | None, run_id: str, run_dir: Path,
                   params: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`wandb.init`'s keyword arguments and its `wandb.Settings`' ones."""
    arguments: dict[str, Any] = {
        "project": project, "name": name, "group": group, "id": run_id, "resume": "allow", "job_type": "train",
        "config": dict(params),
        "reinit": "create_new",  # a run of the user's own in this process goes on beside ours
    }
    if "WANDB_DIR" not in environ:
        arguments["dir"] = str(run_dir)
    if "WANDB_MODE" not in environ:
        arguments["mode"] = "offline"
    # not W&B's capture of stdout and stderr (it replaces sys.stdout): the job's log has them already
    settings = {} if "WANDB_CONSOLE" in environ else {"console": "off"}
    return arguments, settings


class WandbTracker:
    """train.trackers.Tracker for W&B."""

    def __init__(self, *, project: str, name: str, group: str | None, run_id: str, run_dir: Path,
                 params: Mapping[str, Any], environ: Mapping[str, str]) -> None:
        self._arguments, self._settings = init_arguments(project=project, name=name, group=group, run_id=run_id,
                                                         run_dir=run_dir, params=params, environ=environ)
        self._run: Any = None

    def start(self, run_id: str | None) -> str:
        import wandb

        arguments = {**self._arguments, **({"id": run_id} if run_id else {})}
        self._run = wandb.init(**arguments, settings=wandb.Settings(**self._settings))
        return str(self._run.id)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log(dict(values), step=step)

    def finish(self, state: str) -> None:
        if state == "stopped":
            self._run.mark_preempting()  # W&B shows it preempted, not crashed: a requeue continues it
        self._run.finish(exit_code=1 if state == "failed" else 0)
