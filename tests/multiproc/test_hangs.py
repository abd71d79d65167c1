"""Live hangs with real local ranks over Gloo: the report names the stuck rank and the line it waits at,
well before the process group timeout (60 s here); `torchslurm stacks` shows the same on request."""

from __future__ import annotations

import os
import subprocess
import sys
import time
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


def wait_for(report: Path, count: int, procs: list[subprocess.Popen[str]], bound_s: float) -> list[str]:
    """The first `count` reports in `report` once written (every rank still running meanwhile)."""
    deadline = time.monotonic() + bound_s
    while True:
        reports = report.read_text().strip().split("\n\n") if report.exists() else []
        if len(reports) >= count and report.read_text().endswith("\n\n"):
            return reports
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        assert time.monotonic() < deadline, f"{len(reports)} of {count} hang reports within {bound_s} s"
        time.sleep(0.2)


def test_three_kinds_of_hang_are_reported_and_stacks_shows_one(tmp_path: Path, free_port: Callable[[], int]) -> None:
    """hang_action=wait, one 4-rank run: a blocked data loader (rank 1) and a deadlock (rank 2) that end
    after a while, then a rank (3) that skipped the others' all_reduce and waits in a barrier, which
    never ends. Each is reported once, naming the rank and the line; `torchslurm stacks --run-dir`
    during the first names the same."""
    procs = start(tmp_path, free_port(), 4, "hang=loader:1:3:14,lock:2:6:7,skip:3:9", "hang_action=wait")
    report = tmp_path / "hang-report.txt"
    try:
        wait_for(report, 1, procs, bound_s=240)
        stacks = subprocess.run([sys.executable, "-m", "torchslurm", "stacks", "--run-dir", str(tmp_path)],
                                capture_output=True, text=True, timeout=30, env={**os.environ})
        loader, lock, skip = wait_for(report, 3, procs, bound_s=120)
    finally:
        for p in procs:  # the last hang never ends
            p.kill()
        results = [(p.wait(), p.communicate()[1]) for p in procs]
    at = lines(tmp_path)
    assert f"rank 1:       Event.wait at hang_train.py:{at['HOLD']} <- " in loader
    assert "likely cause: rank 1 on " in loader and "is not in a collective" in loader
    assert f"rank 2:       in deadlock at hang_train.py:{at['LOCK']} <- " in lock
    assert "likely cause: rank 2 on " in lock and "rank 2 thread 'holder': " in lock
    assert f"ranks 0-2: all_reduce at hang_train.py:{at['ALL_REDUCE']} <- " in skip
    assert f"rank 3:    barrier at hang_train.py:{at['BARRIER']} <- " in skip
    assert "likely cause: rank 3 on " in skip and "the only rank at barrier" in skip
    assert (f"mismatch: the ranks wait in different collectives: ranks 0-2 in all_reduce at "
            f"hang_train.py:{at['ALL_REDUCE']}; rank 3 in barrier at hang_train.py:{at['BARRIER']}.") in skip
    assert loader in results[0][1]  # the job log too
    assert stacks.returncode == 0, stacks.stderr
    assert "4 of 4 rank(s) answered" in stacks.stdout
    assert f"Event.wait at hang_train.py:{at['HOLD']}" in stacks.stdout
    assert "likely cause: rank 1 on " in stacks.stdout


def test_after_a_hang_report_every_rank_exits_with_a_failure(tmp_path: Path, free_port: Callable[[], int]) -> None:
    """hang_action=exit: rank 1's loader blocks for good; both ranks exit with 1 after the report."""
    results = finish(start(tmp_path, free_port(), 2, "hang=loader:1:2", "hang_action=exit"), bound_s=120)
    assert [code for code, _ in results] == [1, 1], results[0][1]
    text = (tmp_path / "hang-report.txt").read_text()
    assert "likely cause: rank 1 on " in text and "every rank exits now (code 1" in text
    assert text.strip() in results[0][1]
    assert (tmp_path / "hang-stacks.json").is_file()
