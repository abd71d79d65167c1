"""Preemption with real local ranks (Gloo): stop on a signal, resume bitwise, survive kill -9 mid-save."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tests.multiproc.conftest import clean_environ, weights

from torchslurm.train import checkpoint
from torchslurm.train.preemption import PREEMPTED_EXIT_CODE

pytestmark = pytest.mark.multiproc

SCRIPT = Path(__file__).parent / "scripts" / "preempt_train.py"
TORCHSLURM = [sys.executable, "-m", "torchslurm"]
# every step is checked, so a signal after step k stops the ranks after step k + 1 exactly
EVERY_STEP = {"TORCHSLURM_CHECK_PERIOD_S": "0"}




def train(run_dir: Path, *args: str, timeout_s: float = 180, run_flags: tuple[str, ...] = ()
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TORCHSLURM, "run", "--nproc", "2", *run_flags, str(SCRIPT), f"run_dir={run_dir}", *args],
                          capture_output=True, text=True, timeout=timeout_s, env=clean_environ(**EVERY_STEP))


def start(run_dir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*TORCHSLURM, "run", "--nproc", "2", str(SCRIPT), f"run_dir={run_dir}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=clean_environ(**EVERY_STEP))




def epoch_metrics(run_dir: Path) -> list[tuple[object, ...]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = ("epoch", "step", "train_loss", "train_accuracy", "val_loss", "val_accuracy")
    return [tuple(r[k] for k in keys) for r in records if r["kind"] == "epoch"]


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"weights differ in {different}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    result = train(run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir


def test_signal_on_one_rank_stops_all_after_the_same_step_and_resume_is_bitwise(
        uninterrupted: Path, tmp_path: Path) -> None:
    """Only rank 1 gets SIGUSR2, mid-epoch (after step 8 of 10 per epoch); the ranks agree in the
    background during step 9, and both stop after step 9."""
    stopped = train(tmp_path, "signal_at=1:8")
    assert stopped.returncode == PREEMPTED_EXIT_CODE, stopped.stdout + stopped.stderr
    assert "rank 0: stopped at step 9" in stopped.stdout and "rank 1: stopped at step 9" in stopped.stdout
    assert "stopped on request with exit code 75" in stopped.stderr
    assert [step for step, _ in checkpoint.complete(tmp_path / "checkpoints")] == [9]

    resumed = train(tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Resuming from" in resumed.stdout and "epoch 1, batch 9, step 9" in resumed.stdout
    assert_bitwise_equal(weights(uninterrupted), weights(tmp_path))
    assert epoch_metrics(uninterrupted) == epoch_metrics(tmp_path)


def test_a_crashed_rank_is_restarted_by_the_agent_and_the_run_resumes_bitwise(
        uninterrupted: Path, tmp_path: Path) -> None:
    """`torchslurm run --max-restarts 1`: rank 1 dies by SIGKILL after step 17; the agent restarts
    both ranks, which resume from step 15's checkpoint. The restarted ranks use a fresh namespace in
    the agent's store: with the dead ranks' addresses still there, they failed "Connection refused"."""
    result = train(tmp_path, "signal_at=1:17", "signal=KILL", "checkpoint_every_steps=3",
                   run_flags=("--max-restarts", "1"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 1 on " in result.stderr and "stopped responding (no heartbeat)" in result.stderr, result.stderr
    assert "epoch 2, batch 5, step 15" in result.stdout and result.stdout.count("Resuming from") == 1, result.stdout
    assert_bitwise_equal(weights(uninterrupted), weights(tmp_path))
    assert epoch_metrics(uninterrupted) == epoch_metrics(tmp_path)


def test_sigterm_on_rank_0_stops_without_requeue(tmp_path: Path) -> None:
    stopped = train(tmp_path, "signal_at=0:3", "signal=TERM", "epochs=1")  # seen after step 3, agreed after 4
    assert stopped.returncode == PREEMPTED_EXIT_CODE, stopped.stdout + stopped.stderr
    assert stopped.stdout.count("stopping at this step boundary: SIGTERM") == 1  # said by rank 0 alone
    assert [step for step, _ in checkpoint.complete(tmp_path / "checkpoints")] == [4]


def test_preemption_signal_to_the_launcher_reaches_the_ranks(tmp_path: Path) -> None:
    proc = start(tmp_path, "step_sleep=0.2")
    try:
        while not (tmp_path / "pids" / "rank1.pid").exists():
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.1)
        time.sleep(1.0)  # a few steps in
        proc.send_signal(signal.SIGUSR2)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == PREEMPTED_EXIT_CODE, output
    assert "torchslurm run received SIGUSR2 and passed it on to the ranks" in output
    assert "stopping at this step boundary: SIGUSR2" in output
    assert checkpoint.complete(tmp_path / "checkpoints"), output


def test_kill_9_during_checkpoint_write_resumes_from_the_previous_one(uninterrupted: Path, tmp_path: Path) -> None:
    """A 64 MiB frozen parameter makes each save long enough to kill rank 0 inside it."""
    args = ("ballast_mb=64", "checkpoint_every_steps=4")
    proc = start(tmp_path, *args)
    ckpt = tmp_path / "checkpoints"
    try:
        while not checkpoint.complete(ckpt):  # the first save (step 4) completes
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.01)
        while not (saving := [int(p.name.split("-")[1]) for p in ckpt.glob(".staging-*")
                              if int(p.name.split("-")[1]) >= 8]):  # a later one is being written
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.002)
        rank0 = int((tmp_path / "pids" / "rank0.pid").read_text().split()[0])
        os.kill(rank0, signal.SIGKILL)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode != 0, output
    assert "rank 0 failed first" in output and "killed by SIGKILL" in output
    steps = [step for step, _ in checkpoint.complete(ckpt)]
    # the save being written only if its rename won the race with the kill
    assert steps and steps[-1] in (saving[0] - 4, saving[0]), (steps, saving)

    resumed = train(tmp_path, *args)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"step {steps[-1]}" in resumed.stdout
    assert_bitwise_equal(weights(uninterrupted), weights(tmp_path))


@pytest.mark.usefixtures("terminal_sigint")  # the launcher starts with SIGINT at its default, as from a terminal
def test_ctrl_c_stops_at_a_step_boundary_with_a_checkpoint_and_exit_130_without_a_traceback(tmp_path: Path) -> None:
    """The README's script under `torchslurm run`, interrupted the way a terminal does it: SIGINT to
    the launcher's whole process group (the elastic agent starts the ranks in sessions of their own
    and passes the signal on)."""
    script = Path(__file__).parent / "scripts" / "readme_trainer.py"
    launcher = subprocess.Popen([*TORCHSLURM, "run", "--nproc", "2", str(script), str(tmp_path), "100000"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=clean_environ(), start_new_session=True)
    try:
        deadline = time.monotonic() + 120  # a bound on the start-up, not a measurement
        while not (tmp_path / "metrics.jsonl").is_file() or not (tmp_path / "metrics.jsonl").read_text():
            assert launcher.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        os.killpg(launcher.pid, signal.SIGINT)
        output, _ = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert "stopping at this step boundary: Ctrl-C (SIGINT)" in output
    assert "error: torchslurm run got Ctrl-C (SIGINT)" in output and "HINT: run the same command again" in output
    saved = checkpoint.complete(tmp_path / "checkpoints")
    assert saved, output
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert saved[-1][0] >= max(r["step"] for r in records)  # nothing trained after the last checkpoint is lost


def test_ctrl_c_after_the_run_finished_promises_no_checkpoint(tmp_path: Path) -> None:
    """Ctrl-C while the ranks are past their training (here: lingering after final.pt) stops nothing:
    the launcher says so, and not that the ranks will stop at the next step boundary and save."""
    launcher = subprocess.Popen([*TORCHSLURM, "run", "--nproc", "2", str(SCRIPT), f"run_dir={tmp_path}", "epochs=1",
                                 "linger_s=120"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=clean_environ(), start_new_session=True)
    try:
        deadline = time.monotonic() + 120  # a bound on the run, not a measurement
        while not (tmp_path / "final.pt").exists():
            assert launcher.poll() is None and time.monotonic() < deadline, "the run did not finish"
            time.sleep(0.1)
        os.killpg(launcher.pid, signal.SIGINT)
        output, _ = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 130, output
    assert "SIGINT came after every rank had finished training: nothing was left to stop or save." in output
    assert "step boundary" not in output and "save a checkpoint" not in output, output
    assert "Traceback" not in output, output
