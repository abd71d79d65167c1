"""torchslurm.doctor.wire: rank reports carried through a shared pipe as numbered parts."""

from __future__ import annotations

from torchslurm.doctor.facts import Check, Report
from torchslurm.doctor.wire import PART_TAG, report_parts, reports_from_parts


def report(rank: int, *checks: Check, world_size: int = 4) -> Report:
    return Report("node2", rank, world_size, "srun", checks or (Check("placement", "ok", "srun task.", value="srun"),))


# Long enough that one report travels as several parts.
MANY = tuple(Check(f"check_{i}", "ok", "x" * 100) for i in range(20))


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


def test_a_part_carries_the_status_words_the_doctor_has_always_sent() -> None:
    warned = report(1, Check("gpus", "warning", "4 GPUs, 2 ranks.", "set --gpus-per-node 2."))
    (line,) = report_parts(warned, "node2:7")
    assert line.startswith(f"{PART_TAG} node2:7 0 1 ") and '"status": "warn"' in line
    assert reports_from_parts([line]) == ([warned], 0)
