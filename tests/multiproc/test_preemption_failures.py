"""Dead peers with real local ranks started without an agent (as srun starts them): every other
rank exits within the process group timeout with one message naming the dead rank and its host."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiproc

SCRIPT = Path(__file__).parent / "scripts" / "preempt_train.py"
WORLD = 3
TIMEOUT_S = 20  # the process group timeout: the bound on how long a survivor may wait


def start_ranks(run_dir: Path, port: int, *extra: str) -> list[subprocess.Popen[str]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "TORCHSLURM_"))}
    procs = []
    for rank in range(WORLD):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD),
               "LOCAL_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(
            [sys.executable, str(SCRIPT), f"run_dir={run_dir}", "step_sleep=0.2", f"timeout_s={TIMEOUT_S}", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    return procs


def kill_rank_mid_training(run_dir: Path, victim: int, port: int) -> dict[int, tuple[int, str]]:
    procs = start_ranks(run_dir, port)
    try:
        pid_file = run_dir / "pids" / f"rank{victim}.pid"
        while not (pid_file.exists() and (run_dir / "pids" / f"rank{WORLD - 1}.pid").exists()):
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.1)
        time.sleep(1.5)  # a few steps in
        os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        # The bound: a survivor that waits for longer than the group timeout (+ diagnosis and
        # interpreter exit) is hung, and communicate() raises TimeoutExpired.
        errors = [p.communicate(timeout=TIMEOUT_S + 30)[1] for p in procs]
        return {rank: (p.returncode, errors[rank]) for rank, p in enumerate(procs)}
    finally:
        for p in procs:
            p.kill()


def test_kill_9_of_one_rank_ends_all_with_one_root_cause_message(tmp_path: Path,
                                                               free_port: Callable[[], int]) -> None:
    results = kill_rank_mid_training(tmp_path, victim=2, port=free_port())
    host = socket.gethostname()
    assert results[2][0] == -signal.SIGKILL
    assert {rank: code for rank, (code, _) in results.items() if rank != 2} == {0: 1, 1: 1}
    assert f"error: rank 2 on {host} (127.0.0.1) stopped responding (no heartbeat)" in results[0][1]
    # what rank 0's own collective reported: Gloo's wording depends on which peer socket broke first
    # ("Connection closed by peer", "Connection reset by peer", a read timeout), so only its place is fixed
    assert f"(rank 0 on {host} saw: " in results[0][1]
    assert "stopped because a peer failed; the root cause is in the message of the lowest rank" in results[1][1]
    assert "Traceback" not in results[0][1] + results[1][1]


def test_kill_9_of_rank_0_is_named_from_its_refusing_store(tmp_path: Path, free_port: Callable[[], int]) -> None:
    results = kill_rank_mid_training(tmp_path, victim=0, port=free_port())
    host = socket.gethostname()
    assert {rank: code for rank, (code, _) in results.items() if rank != 0} == {1: 1, 2: 1}
    assert f"error: rank 0 on {host} (127.0.0.1) died: its host answers but its store refuses" in results[1][1]
    assert "the root cause is in the message of the lowest rank" in results[2][1]


def test_a_rank_that_stops_on_its_own_error_is_named_with_it(tmp_path: Path, free_port: Callable[[], int]) -> None:
    procs = start_ranks(tmp_path, free_port(), "raise_at=2:3")
    try:
        errors = [p.communicate(timeout=TIMEOUT_S + 30)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert "ValueError: injected failure at step 3" in errors[2]
    assert f"error: rank 2 on {socket.gethostname()} (127.0.0.1) stopped with an error: ValueError: injected " \
           "failure at step 3 (its log has all of it)" in errors[0], errors[0]
    assert "the root cause is in the message of the lowest rank" in errors[1]
    assert [p.returncode for p in procs] == [1, 1, 1]
