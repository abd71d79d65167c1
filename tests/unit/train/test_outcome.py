"""outcome.json as the Trainer writes it (train.outcome), read back by jobs.sweepstate; the Trainer's
own use of it is tested on real ranks in tests/multiproc/test_trainer.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from torchslurm.errors import CheckpointError
from torchslurm.jobs.sweepstate import OUTCOME_FILE, Outcome, read_outcome
from torchslurm.train.outcome import RunOutcome, one_line, requeued, write
from torchslurm.train.preemption import Preemption, PreemptionConfig
from torchslurm.train.stopagreement import StopRequest


class Clock:
    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def test_rank_0_writes_how_the_fit_ended(tmp_path: Path) -> None:
    where = [(0, 0)]
    with RunOutcome(tmp_path, 0, lambda: where[0], clock=lambda: 1700000000.0, timer=Clock(0, 12.5)) as run:
        where[0] = (3, 69)
        run.ended(stopped=False, requeued=True)  # requeued means nothing for a finished run
    assert read_outcome(tmp_path) == Outcome("completed", 3, 69, 12.5, 1700000000.0, None, 0, False)
    with RunOutcome(tmp_path, 0, lambda: (1, 30), clock=lambda: 5.0, timer=Clock(1.0, 3.0)) as run:
        run.ended(stopped=True, requeued=True)
    assert read_outcome(tmp_path) == Outcome("stopped", 1, 30, 2.0, 5.0, None, 0, True)


def test_other_ranks_write_only_their_failure(tmp_path: Path) -> None:
    with RunOutcome(tmp_path, 1, lambda: (0, 7)) as run:
        run.ended(stopped=False)
    assert not (tmp_path / OUTCOME_FILE).exists()
    with pytest.raises(CheckpointError), RunOutcome(tmp_path, 3, lambda: (2, 40)):
        raise CheckpointError("checkpoint step-40 could not be written to disk: No space left\nmore", "free space")
    found = read_outcome(tmp_path)
    assert found is not None
    assert (found.state, found.rank, found.step, found.error) == (
        "failed", 3, 40, "checkpoint step-40 could not be written to disk: No space left")


def test_a_failure_is_one_line() -> None:
    assert one_line(ValueError("bad\nworse")) == "ValueError: bad"
    assert one_line(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert one_line(RuntimeError("x" * 900)) == "RuntimeError: " + "x" * 486
    assert one_line(CheckpointError("\n", "hint")) == "CheckpointError"


def test_an_exit_is_no_failure(tmp_path: Path) -> None:
    with pytest.raises(SystemExit), RunOutcome(tmp_path, 0, lambda: (0, 0)):
        raise SystemExit(75)
    assert not (tmp_path / OUTCOME_FILE).exists()


def test_a_file_that_cannot_be_written_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    outcome = Outcome("completed", 1, 2, 3.0, 4.0)
    with caplog.at_level(logging.WARNING, "torchslurm.train.outcome"):
        assert write(tmp_path / "gone", outcome) is None
    assert f"could not write {tmp_path / 'gone' / OUTCOME_FILE}" in caplog.text
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / OUTCOME_FILE).symlink_to(target)
    assert write(tmp_path, outcome) == tmp_path / OUTCOME_FILE  # the link is replaced, its target untouched
    assert target.read_text() == "keep" and json.loads((tmp_path / OUTCOME_FILE).read_text())["step"] == 2


def test_requeued_follows_the_requeue_decision() -> None:
    task = {"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "2"}
    stop = Preemption(PreemptionConfig(max_requeues=3), environ=task)
    stop.request = StopRequest(True, False, False)
    assert requeued(stop)
    stop.request = StopRequest(False, True, False)  # SIGTERM: Slurm decides, torchslurm does not requeue
    assert not requeued(stop)
    spent = Preemption(PreemptionConfig(max_requeues=3), environ={**task, "SLURM_RESTART_COUNT": "3"})
    spent.request = StopRequest(True, False, False)
    assert not requeued(spent) and not requeued(None)
