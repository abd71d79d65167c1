"""A rank slowed on purpose is named in the progress line, metrics.jsonl and run_dir's stragglers file;
a healthy run names none (3 local Gloo ranks; tests/multiproc/scripts/straggler_train.py runs both)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tests.multiproc.conftest import clean_environ

pytestmark = pytest.mark.multiproc

SCRIPT = Path(__file__).parent / "scripts" / "straggler_train.py"


def records(run_dir: Path) -> list[dict[str, object]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "step"]  # one per gather: log_every=5 too


def test_a_slow_rank_is_named_and_a_healthy_run_names_none(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "torchslurm", "run", "--nproc", "3", str(SCRIPT), str(tmp_path),
                             "2"], capture_output=True, text=True, timeout=120, env=clean_environ())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    healthy, slow = records(tmp_path / "healthy"), records(tmp_path / "slow")
    assert len(healthy) == len(slow) == 6  # 30 steps, a gather every 5
    assert all(r["stragglers"] == 0 for r in healthy), healthy
    assert json.loads((tmp_path / "healthy" / "stragglers.json").read_text())["named"] == []
    # never before the window of 3 gathers is full, then named to the end
    first = next(i for i, r in enumerate(slow) if r["stragglers"])
    assert first >= 2 and all(r["stragglers"] == 1 for r in slow[first:]), slow
    named = json.loads((tmp_path / "slow" / "stragglers.json").read_text())["named"]
    assert [(n["ranks"], n["node"], n["whole_node"]) for n in named] == [([2], socket.gethostname(), False)]
    assert named[0]["ratio"] > 2 and all(r["slowest_rank"] == 2 for r in slow[first:])
    text = named[0]["text"]
    assert text.startswith("rank 2 on ") and text.endswith("× the median compute time for the last 15 steps")
    healthy_log, slow_log = result.stderr.split("run_dir " + str(tmp_path / "slow"))
    assert "straggler" not in healthy_log
    assert slow_log.count("straggler at step ") == 1  # once, when it is first named
    assert f"straggler at step {5 * (first + 1)}: rank 2 on " in slow_log
    assert "step 30: loss" in slow_log and "; straggler: rank 2 on " in slow_log.split("step 30: loss")[1]
