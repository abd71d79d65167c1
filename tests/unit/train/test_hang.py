"""The hang detector's decisions: its timeout, its tick and the report's text (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchslurm.errors import ConfigError
from torchslurm.runtime.stackdump import Frame, RankStack, ThreadStack
from torchslurm.train.config import TrainConfig
from torchslurm.train.hang import FLOOR_S, hang_report, hang_timeout, tick_for, timeout_problem


def test_a_configured_timeout_is_used_as_it_is() -> None:
    assert hang_timeout(5.0, [], 300.0) == 5.0


def test_the_derived_timeout_waits_for_a_step_then_follows_the_median_with_a_floor() -> None:
    assert hang_timeout(0, [], 300.0) is None  # start-up: only the group timeout
    assert hang_timeout(0, [0.1, 0.2, 50.0], 300.0) == FLOOR_S
    assert hang_timeout(0, [4.0, 5.0, 6.0], 300.0) == 100.0
    assert hang_timeout(0, [14.0, 15.0], 300.0) == 240.0  # below the group timeout


def test_a_timeout_at_or_above_the_group_timeout_is_refused() -> None:
    assert timeout_problem(299, 300) is None
    problem = timeout_problem(300, 300)
    assert problem is not None and "hang_timeout_s=300 but the process group timeout is 300 s" in str(problem)
    assert "set hang_timeout_s below 300" in str(problem)


def test_tick() -> None:
    assert tick_for(3.0, 60.0) == pytest.approx(0.3)
    assert tick_for(0, 300.0) == 1.0
    assert tick_for(0.5, 60.0) == 0.1


def test_config_keys_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"hang_action='never'.*exit, wait, off"):
        TrainConfig(hang_action="never")
    with pytest.raises(ConfigError, match=r"hang_timeout_s=-1.0, expected 0 \(derived"):
        TrainConfig(hang_timeout_s=-1.0)
    assert TrainConfig().hang_action == "exit" and TrainConfig().hang_timeout_s == 0


def test_the_report_says_how_long_where_and_what_happens_next(tmp_path: Path) -> None:
    frames = (Frame("/home/u/train.py", 40, "main"), Frame("/home/u/train.py", 12, "step"))
    stacks = {0: RankStack(0, 2, "node1", 10, (ThreadStack("MainThread", True, frames),), 5)}
    text = hang_report(stacks, 2, 61.2, 60.0, tmp_path, "exit")
    assert text.splitlines()[0] == ("hang: no rank finished a step for 61.2 s (hang_timeout_s=60); where each rank's "
                                    "main thread is, innermost call first:")
    assert "  rank 0: in step at train.py:12 <- step at train.py:40  [node1]" in text
    assert "rank 1: no answer" in text
    assert text.endswith(f"{tmp_path / 'hang-stacks.json'}; every rank exits now (code 1, requeued as after a "
                         "failure).")
