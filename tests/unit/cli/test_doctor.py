"""torchslurm.cli.doctor: the report as text, rank reports carried through a shared pipe, no torch needed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

from torchslurm.cli.doctor import render, report_parts, reports_from_parts
from torchslurm.doctor.facts import Check, Report

WithoutTorch = Callable[..., subprocess.CompletedProcess[str]]


def report(rank: int, *checks: Check, world_size: int = 4) -> Report:
    return Report("node2", rank, world_size, "srun", checks or (Check("placement", "ok", "srun task.", value="srun"),))


# Long enough that one report travels as several parts.
MANY = tuple(Check(f"check_{i}", "ok", "x" * 100) for i in range(20))
FAILED = report(2, Check("placement", "ok", "srun task 2 of 4.", value="srun"),
                Check("gloo_socket_ifname", "fail", "GLOO_SOCKET_IFNAME=eth0 does not exist here.",
                      "unset GLOO_SOCKET_IFNAME.", "eth0"))


def test_every_line_names_host_and_rank_when_several_ranks_print() -> None:
    text = render(report(2, *MANY))
    assert all(line.startswith("node2/2: ") for line in text.splitlines())
    assert text.splitlines()[-1] == "node2/2: 20 ok, 0 warning(s), 0 failure(s)"
    assert not render(report(0, world_size=1)).startswith("node2/")


def test_a_failure_shows_its_hint_under_it() -> None:
    lines = render(FAILED).splitlines()
    fail = next(i for i, line in enumerate(lines) if "FAIL  gloo_socket_ifname" in line)
    assert lines[fail + 1].strip().endswith("HINT: unset GLOO_SOCKET_IFNAME.")
    assert lines[-1].endswith("1 ok, 0 warning(s), 1 failure(s)")


def test_rank_reports_survive_interleaving_as_parts_shorter_than_srun_chunks() -> None:
    results = [report(0, *MANY), report(2, *MANY[:12])]
    first, second = (report_parts(r, f"node2:{pid}") for pid, r in enumerate(results))
    assert len(first) > 1 and all(len(line.encode()) < 1024 and line.endswith("\n") for line in first + second)
    interleaved = [line for pair in zip(reversed(first), second, strict=False) for line in pair]
    interleaved += first[: len(first) - len(second)] if len(first) > len(second) else second[len(first):]
    assert reports_from_parts(interleaved) == (results, 0)
    assert reports_from_parts(first[1:] + second) == ([results[1]], 1)  # an incomplete report is counted
    labelled = [f"{n}: {line}" for n, line in enumerate(second)]  # srun --label (SLURM_LABELIO=1)
    assert reports_from_parts(labelled) == ([results[1]], 0)


def test_parts_of_processes_that_claim_the_same_rank_stay_apart_and_garbage_is_counted() -> None:
    result = report(0, *MANY)  # an exported RANK: every task claims rank 0
    a, b = report_parts(result, "node1:11"), report_parts(result, "node2:22")
    assert reports_from_parts([*a, *b]) == ([result, result], 0)
    mangled = ["@torchslurm-doctor-part node3:33 0 1", "@torchslurm-doctor-part node3:33 x 2 {",
               "@torchslurm-doctor-part node4:44 5 1 {}", "@torchslurm-doctor-part node5:55 0 1 {not json"]
    assert reports_from_parts([*a, *mangled]) == ([result], 3)  # node3 (no count), node4 (no part 0), node5


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
