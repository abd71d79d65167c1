"""Live hangs with real local ranks over Gloo: the report names the stuck rank and the line it waits at,
well before the process group timeout (60 s here); `torchslurm stacks` shows the same on request."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.multiproc.conftest import clean_environ

pytestmark = pytest.mark.multiproc

SCRIPT = Path(__file__).parent / "scripts" / "hang_train.py"


def start(run_dir: Path, port: int, world: int, *args: str) -> list[subprocess.Popen[str]]:
    procs = []
    for rank in range(world):
        env = clean_environ(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), f"run_dir={run_dir}", "hang_s=3", *args],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    return procs


def lines(run_dir: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split("=") for line in (run_dir / "lines.txt").read_text().split())}


def finish(procs: list[subprocess.Popen[str]], bound_s: float) -> list[tuple[int, str]]:
    try:
        return [(p.wait(bound_s), p.communicate()[1]) for p in procs]
    finally:
        for p in procs:
            p.kill()


def test_a_blocked_loader_and_a_deadlock_are_reported_and_stacks_shows_them(
        tmp_path: Path, free_port: Callable[[], int]) -> None:
    """hang_action=wait: two hangs in one run (they end after hold_s), each reported once, naming the
    right rank and line; `torchslurm stacks --run-dir` during the first one names the same."""
    procs = start(tmp_path, free_port(), 4, "hang=loader:1:3:14,lock:2:6:7", "hang_action=wait")
    report = tmp_path / "hang-report.txt"
    try:
        while not report.exists():
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            subprocess.run(["sleep", "0.2"], check=True)
        stacks = subprocess.run([sys.executable, "-m", "torchslurm", "stacks", "--run-dir", str(tmp_path)],
                                capture_output=True, text=True, timeout=30, env={**os.environ})
    finally:
        results = finish(procs, bound_s=120)
    at = lines(tmp_path)
    assert [code for code, _ in results] == [0, 0, 0, 0], results[0][1]
    first, second = report.read_text().strip().split("\n\n")
    assert f"rank 1:       Event.wait at hang_train.py:{at['HOLD']} <- " in first
    assert "likely cause: rank 1 on " in first and "is not in a collective" in first
    assert f"rank 2:       in deadlock at hang_train.py:{at['LOCK']} <- " in second
    assert "likely cause: rank 2 on " in second
    assert "rank 2 thread 'holder'" in second
    assert first in results[0][1]  # the job log too
    assert stacks.returncode == 0, stacks.stderr
    assert "4 of 4 rank(s) answered" in stacks.stdout
    assert f"Event.wait at hang_train.py:{at['HOLD']}" in stacks.stdout
    assert "likely cause: rank 1 on " in stacks.stdout


def test_a_rank_in_another_collective_is_called_out_and_every_rank_exits(
        tmp_path: Path, free_port: Callable[[], int]) -> None:
    """Ranks 0-1 all_reduce, rank 2 skipped it and waits in a barrier: with Gloo this never ends by
    itself (not even at the group timeout); the report names the mismatch and every rank exits with 1."""
    results = finish(start(tmp_path, free_port(), 3, "hang=skip:2:3", "hang_action=exit"), bound_s=120)
    at = lines(tmp_path)
    assert [code for code, _ in results] == [1, 1, 1], results[0][1]
    text = (tmp_path / "hang-report.txt").read_text()
    assert f"ranks 0-1: all_reduce at hang_train.py:{at['ALL_REDUCE']} <- " in text
    assert f"rank 2:    barrier at hang_train.py:{at['BARRIER']} <- " in text
    assert (f"mismatch: the ranks wait in different collectives: ranks 0-1 in all_reduce at "
            f"hang_train.py:{at['ALL_REDUCE']}; rank 2 in barrier at hang_train.py:{at['BARRIER']}.") in text
    assert "likely cause: rank 2 on " in text
    assert text.strip() in results[0][1]
    assert (tmp_path / "hang-stacks.json").is_file()
