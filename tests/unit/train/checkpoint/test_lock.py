"""One run at a time in a checkpoints folder: who holds its lock, when a lock is stale, taking over."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from torchslurm.errors import CheckpointError
from torchslurm.train.checkpoint import lock
from torchslurm.train.checkpoint.layout import LOCK
from torchslurm.train.checkpoint.lock import Holder, Seen, acquire, look, stale

ME = Holder("node1", 100, "4242", 0.0, "mine")


def _held(**changes: object) -> Holder:
    return dataclasses.replace(Holder("node1", 200, "4242", 0.0, "theirs"), **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(("seen", "reason"), [
    (Seen(_held(), 5, alive=True), None),
    (Seen(_held(), 5, alive=False), "its process 200 on node1 is gone"),  # a crash, a torchrun restart
    (Seen(_held(host="node2"), 5, alive=None), "this same Slurm job 4242 on node2, now restarted here"),  # requeue
    (Seen(_held(host="node2", job="17"), 5, alive=None), None),
    (Seen(_held(host="node2", job=None), 5, alive=None), None),
    (Seen(_held(host="node2", job="17"), 601, alive=None), "its heartbeat stopped 601 s ago"),
    (Seen(_held(), 601, alive=True), "its heartbeat stopped 601 s ago"),
    (Seen(None, 5, alive=None), None),  # unreadable: the heartbeat alone decides
    (Seen(None, 700, alive=None), "its heartbeat stopped 700 s ago"),
])
def test_when_a_lock_is_stale(seen: Seen, reason: str | None) -> None:
    found = stale(seen, ME)
    assert found == reason or (reason is not None and found is not None and reason in found)


def _dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    return int(child.stdout)


def _plant(root: Path, holder: Holder) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / LOCK).write_text(json.dumps(dataclasses.asdict(holder)))
    return root / LOCK


def test_a_held_folder_is_an_error_naming_the_holder_and_free_once_released(tmp_path: Path) -> None:
    first = acquire(tmp_path, lock.me({"SLURM_JOB_ID": "4242"}))
    with pytest.raises(CheckpointError, match=rf"^{tmp_path} is in use by another run \(host .*, pid {os.getpid()}, "
                                              r"Slurm job 4242, since .*\); two runs in one run_dir would delete .*"
                                              r"HINT: wait for that run to end, or give this one another run_dir"):
        acquire(tmp_path, lock.me({"SLURM_JOB_ID": "99"}))
    first.release()
    assert not (tmp_path / LOCK).exists()
    acquire(tmp_path, lock.me({})).release()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no staging or stale files left


def test_a_lock_left_by_a_dead_process_or_by_the_same_job_elsewhere_is_taken_over(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    here = lock.me({"SLURM_JOB_ID": "4242"})
    _plant(tmp_path, dataclasses.replace(here, pid=_dead_pid(), token="crashed"))
    with caplog.at_level(logging.WARNING, logger="torchslurm.train.checkpoint.lock"):
        taken = acquire(tmp_path, here)
    assert "taking over" in caplog.text and "is gone" in caplog.text
    assert taken.held()
    taken.release()
    _plant(tmp_path, dataclasses.replace(here, host="elsewhere", token="before-the-requeue"))
    acquire(tmp_path, here).release()
    _plant(tmp_path, dataclasses.replace(here, host="elsewhere", job="17", token="another-job"))
    with pytest.raises(CheckpointError, match=r"in use by another run \(host elsewhere, pid \d+, Slurm job 17"):
        acquire(tmp_path, here)
    old = time.time() - 3600
    os.utime(tmp_path / LOCK, (old, old))  # its node died: no heartbeat for an hour
    acquire(tmp_path, here).release()


def test_of_several_runs_taking_over_one_stale_lock_one_wins(tmp_path: Path) -> None:
    _plant(tmp_path, dataclasses.replace(lock.me({}), pid=_dead_pid(), token="crashed"))
    won: list[lock.Lock] = []
    refused: list[CheckpointError] = []

    def take() -> None:
        try:
            won.append(acquire(tmp_path, lock.me({})))
        except CheckpointError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(refused) == 3 and won[0].held()
    won[0].release()


def test_the_holder_keeps_its_lock_fresh_and_leaves_one_taken_over(tmp_path: Path) -> None:
    held = acquire(tmp_path, lock.me({}), heartbeat_s=0.01)
    old = time.time() - 3600
    os.utime(tmp_path / LOCK, (old, old))
    deadline = time.monotonic() + 10
    while (seen := look(tmp_path / LOCK, held.holder)) is not None and seen.age_s > 60 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen is not None and seen.age_s < 60 and seen.alive
    _plant(tmp_path, dataclasses.replace(held.holder, token="someone-else"))
    held.release()  # not ours any more: left in place
    assert (tmp_path / LOCK).exists()


def test_a_reused_pid_is_not_the_holder(tmp_path: Path) -> None:
    here = lock.me({})
    _plant(tmp_path, dataclasses.replace(here, token="old", process_start="1"))  # our pid, another process
    seen = look(tmp_path / LOCK, here)
    assert seen is not None and seen.alive is False
