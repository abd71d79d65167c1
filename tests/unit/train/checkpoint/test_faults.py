"""Faults injected around checkpoints: a full disk (the kernel's own ENOSPC, from /dev/full), an I/O
error, a process killed at each point of the save / publish / prune sequence (simulated by raising
where the effect would run; one real kill -9 of a saving process), two writers, a corrupt newest.
After each, the newest checkpoint that verifies still loads, and the next run goes on from it."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.unit.train.checkpoint.conftest import linear_snapshot
from torch import nn

from torchslurm.errors import CheckpointError
from torchslurm.train import checkpoint
from torchslurm.train.checkpoint import Checkpointer, hashed, layout, writer
from torchslurm.train.checkpoint.layout import Pruner
from torchslurm.train.checkpoint.writer import Writer, write


class Killed(BaseException):
    """The process died here (nothing after this point of the sequence ran)."""


def _history(root: Path, pruner: Pruner) -> None:
    """Steps 1 and 2, on disk, as a run with keep_last=2 leaves them."""
    for step in (1, 2):
        write(linear_snapshot(root, step, keep_last=2)[0], pruner=pruner)
    pruner.wait()


def _newest_loads(root: Path) -> int:
    """The step of the checkpoint resume=auto picks; it verifies (checksums) and loads."""
    found = checkpoint.load_latest(root)
    assert found is not None
    path, _ = found
    checkpoint.read_model(path)
    return int(path.name.removeprefix("step-"))


def _next_run_goes_on(root: Path) -> None:
    """A new run saves step 4 over whatever was left: leftovers cleared, it loads."""
    pruner = Pruner()
    write(linear_snapshot(root, 4, keep_last=2)[0], pruner=pruner)
    pruner.wait()
    assert _newest_loads(root) == 4
    assert not [p.name for p in root.iterdir() if p.name.startswith((".staging", ".trash"))]


def _raise_on(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, when: Callable[..., bool],
              error: BaseException, after: bool = False) -> None:
    """`owner.name` raises `error` on the first call for which `when(*args)` holds (once the real
    call ran, with `after`)."""
    real = getattr(owner, name)
    fired: list[bool] = []

    def faulty(*args: Any, **kwargs: Any) -> Any:
        if fired or not when(*args):
            return real(*args, **kwargs)
        fired.append(True)
        if after:
            real(*args, **kwargs)
        raise error

    monkeypatch.setattr(owner, name, faulty)


def _named(name: str) -> Callable[..., bool]:
    return lambda path, *rest: Path(path).name == name or Path(path).name.startswith(name)


# Each point of a save: where the process dies, and the newest step that must load afterwards.
KILL_POINTS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], int]] = {
    "tensors.pt created, nothing written": (
        lambda mp: _raise_on(mp, hashed, "open_write", _named("tensors.pt"), Killed(), after=True), 2),
    "before COMPLETE": (lambda mp: _raise_on(mp, writer, "open_write", _named("COMPLETE"), Killed()), 2),
    "after COMPLETE, before its fsync": (lambda mp: _raise_on(mp, layout, "fsync", _named("COMPLETE"), Killed()), 2),
    "before the rename": (lambda mp: _raise_on(mp, os, "replace", _named(".staging-000000003"), Killed()), 2),
    "after the rename, before the folder's fsync": (
        lambda mp: _raise_on(mp, layout, "fsync", lambda path: Path(path).name == "ckpt", Killed()), 3),
    "before pruning": (lambda mp: _raise_on(mp, Pruner, "prune", lambda self, *a: True, Killed()), 3),
    "mid pruning": (lambda mp: _raise_on(mp, os, "replace", _named("step-000000001"), Killed(), after=True), 3),
    "before the trash is deleted": (lambda mp: mp.setattr(layout, "_delete", lambda paths: None), 3),
}


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_kill_at_each_point_of_a_save_keeps_a_checkpoint_that_loads(tmp_path: Path, point: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ckpt"
    _history(root, Pruner())
    inject, newest = KILL_POINTS[point]
    with monkeypatch.context() as patched:
        inject(patched)
        try:
            pruner = Pruner()
            write(linear_snapshot(root, 3, keep_last=1)[0], pruner=pruner)
            pruner.wait()
        except Killed:
            pass
    assert _newest_loads(root) == newest
    _next_run_goes_on(root)


@pytest.mark.parametrize("name", ["tensors.pt", "rank-00000.pt", "state.pt", "COMPLETE"])
@pytest.mark.parametrize("fault", ["ENOSPC", "EIO"])
def test_a_full_disk_or_an_io_error_on_any_file_keeps_the_previous_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, fault: str) -> None:
    root = tmp_path / "ckpt"
    history = Writer()
    for step in (1, 2):
        history.save(linear_snapshot(root, step, keep_last=1)[0])
    history.close()
    owner = writer if name == "COMPLETE" else hashed
    real = owner.open_write

    def failing(path: Path, mode: str = "w") -> Any:
        if Path(path).name != name:
            return real(path, mode)
        if fault == "ENOSPC":
            return open("/dev/full", mode)
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    monkeypatch.setattr(owner, "open_write", failing)
    run = Writer()
    words = re.escape("could not be written to disk (it is full)" if fault == "ENOSPC" else "Input/output error")
    with pytest.raises(CheckpointError, match=rf"checkpoint of step 3 .*{words}"):
        run.save(linear_snapshot(root, 3, keep_last=1)[0])
    monkeypatch.undo()
    run.close()
    assert _newest_loads(root) == 2
    _next_run_goes_on(root)


def test_a_corrupt_newest_is_skipped_and_the_next_run_goes_on(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _history(root, Pruner())
    tensors = checkpoint.step_dir(root, 2) / "tensors.pt"
    tensors.write_bytes(tensors.read_bytes()[:-7])
    assert _newest_loads(root) == 1
    _next_run_goes_on(root)


SAVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import torch
    from torch import nn
    from torchslurm.train.checkpoint import Checkpointer, TrainProgress

    model = nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 64)).sum().backward()
    optimizer.step()
    saver = Checkpointer(Path(sys.argv[1]), model, optimizer, rank=0, world_size=1, keep_last=2, config={},
                         order={}, environ={"SLURM_JOB_ID": "4242"})
    for step in range(1, 100000):
        saver.save(TrainProgress(0, step, step, [0.0, 0.0, 0.0]))
        if step == 3:
            print("saving", flush=True)
""")


def test_a_run_killed_while_saving_leaves_a_checkpoint_that_loads_and_a_run_dir_the_next_run_takes(
        tmp_path: Path) -> None:
    """A real process saving as fast as it can, kill -9'd: the second run is refused while it lives,
    then takes over its lock (its process is gone) and resumes from a checkpoint that verifies."""
    root = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(checkpoint.__file__).parents[3]),
                                                         os.environ.get("PYTHONPATH", "")])}
    saving = subprocess.Popen([sys.executable, "-c", SAVER, str(root)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert saving.stdout is not None and saving.stdout.readline() == "saving\n"
        model = nn.Linear(64, 64)
        second = Checkpointer(root, model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rank=0,
                              world_size=1, keep_last=2, config={}, order={})
        with pytest.raises(CheckpointError, match=rf"in use by another run \(host .*, pid {saving.pid}, "
                                                  r"Slurm job 4242"):
            second.own()
        time.sleep(0.05)  # in the middle of some save
    finally:
        saving.send_signal(signal.SIGKILL)
        saving.wait()
    progress = second.restore("auto")
    assert progress is not None and progress.global_step >= 3
    second.own()  # the dead run's lock is taken over
    second.save(progress)
    second.close()
    assert _newest_loads(root) == progress.global_step
