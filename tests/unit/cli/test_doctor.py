"""torchslurm.cli.doctor and cli.bench without torch (the report's text: tests/unit/doctor/test_facts.py;
rank reports through a shared pipe: tests/unit/doctor/test_wire.py)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

WithoutTorch = Callable[..., subprocess.CompletedProcess[str]]


def test_doctor_runs_and_says_so_without_torch(without_torch: WithoutTorch) -> None:
    result = without_torch("doctor", "--json")
    assert result.returncode == 0, result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["torch"]["status"] == "warn" and "not installed" in checks["torch"]["detail"]
    assert checks["placement"]["status"] == "ok"


def test_bench_validates_and_plans_without_torch(without_torch: WithoutTorch) -> None:
    result = without_torch("bench", "--nproc", "2", "--sizes", "1K,1M", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("local: ") and "-m torchslurm.cli.bench --sizes 1K,1M" in result.stdout
