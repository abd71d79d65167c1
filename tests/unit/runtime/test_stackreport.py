"""Grouping every rank's stacks, naming the odd group and mismatched collectives: pure, on plain values."""

from __future__ import annotations

from torchslurm.runtime.stackdump import Frame, RankStack, ThreadStack
from torchslurm.runtime.stackreport import format_groups, group_ranks, likely_cause, mismatches, place, rank_ranges

TORCH = "/venv/lib/python3.11/site-packages/torch"
C10D = Frame(f"{TORCH}/distributed/distributed_c10d.py", 3252, "all_reduce", "library")
BARRIER = Frame(f"{TORCH}/distributed/distributed_c10d.py", 4700, "barrier", "library")
WRAPPER = Frame(f"{TORCH}/distributed/c10d_logger.py", 81, "_exception_logger.<locals>.wrapper", "library")
MAIN = Frame("/home/u/train.py", 140, "main")


def step(line: int, *inner: Frame) -> tuple[Frame, ...]:
    return (MAIN, Frame("/home/u/train.py", line, "step"), *inner)


def rank(r: int, frames: tuple[Frame, ...], collectives: int | None = 42, host: str = "node1",
         others: tuple[ThreadStack, ...] = ()) -> RankStack:
    return RankStack(r, 8, host, 1000 + r, (ThreadStack("MainThread", True, frames), *others), collectives)


def test_rank_ranges() -> None:
    assert rank_ranges([0, 1, 2, 4, 5, 6, 7]) == "ranks 0-2, 4-7"
    assert rank_ranges([3]) == "rank 3"
    assert rank_ranges([5, 1]) == "ranks 1, 5"


def test_place_names_the_collective_at_the_users_line_then_its_callers() -> None:
    text, site = place(step(88, WRAPPER, C10D))
    assert text == "all_reduce at train.py:88 <- step at train.py:140"
    assert site == "all_reduce at train.py:88"


def test_place_of_a_frame_waiting_in_c_names_its_own_function() -> None:
    assert place(step(31))[0] == "in step at train.py:31 <- step at train.py:140"


def test_the_users_innermost_frame_is_kept_when_torchslurm_frames_are_many() -> None:
    own = tuple(Frame("/src/torchslurm/train/trainer.py", 200 + i, f"Trainer.f{i}", "own") for i in range(6))
    frames = (*step(12), *own, Frame(f"{TORCH}/_tensor.py", 623, "Tensor.backward", "library"))
    text, site = place(frames)
    assert site == "Tensor.backward at trainer.py:205"
    assert text.endswith("... <- Trainer.f0 at train.py:12")


def test_a_loader_stuck_on_one_rank_is_the_likely_cause() -> None:
    waiting = step(88, WRAPPER, C10D)
    loader = step(41, Frame(f"{TORCH}/utils/data/dataloader.py", 733, "_BaseDataLoaderIter.__next__", "library"))
    stacks = {r: rank(r, waiting) for r in (0, 1, 2, 4, 5, 6, 7)} | {3: rank(3, loader, 41, "node2")}
    groups = group_ranks(stacks)
    assert [g.ranks for g in groups] == [(0, 1, 2, 4, 5, 6, 7), (3,)]
    assert likely_cause(groups) == ("rank 3 on node2 is not in a collective (_BaseDataLoaderIter.__next__ at "
                                    "train.py:41); ranks 0-2, 4-7 wait for it in all_reduce.")
    assert mismatches(groups) == []  # 41 issued, the others wait in their 42nd: nothing skipped


def test_a_rank_in_another_collective_is_a_mismatch() -> None:
    stacks = {0: rank(0, step(88, C10D)), 1: rank(1, step(88, C10D)), 2: rank(2, step(95, BARRIER))}
    groups = group_ranks(stacks)
    assert likely_cause(groups) == "rank 2 on node1: the only rank at barrier at train.py:95."
    assert mismatches(groups) == ["the ranks wait in different collectives: ranks 0-1 in all_reduce at train.py:88; "
                                  "rank 2 in barrier at train.py:95."]


def test_ranks_at_different_collective_counts_and_a_rank_that_skipped_one() -> None:
    stacks = {0: rank(0, step(88, C10D), 42), 1: rank(1, step(88, C10D), 43), 2: rank(2, step(50), 40)}
    texts = mismatches(group_ranks(stacks))
    assert texts == ["the waiting ranks are at different collectives: rank 0 in their collective #42; rank 1 in "
                     "their collective #43 (a rank skipped a collective, or made one the others did not)."]
    stacks[1] = rank(1, step(88, C10D), 42)
    assert mismatches(group_ranks(stacks)) == [
        "rank 2 has issued 40 collectives and ranks 0-1 wait in their #42: rank 2 skipped 1 collective(s)."]


def test_library_lines_do_not_split_groups_but_user_lines_do() -> None:
    queue_wait = Frame("/usr/lib/python3.11/threading.py", 320, "Condition.wait", "library")
    moved = Frame("/usr/lib/python3.11/threading.py", 324, "Condition.wait", "library")
    stacks = {0: rank(0, step(41, queue_wait)), 1: rank(1, step(41, moved)), 2: rank(2, step(42, moved))}
    assert [g.ranks for g in group_ranks(stacks)] == [(0, 1), (2,)]


def test_one_place_for_all_names_no_cause_and_missing_ranks_are_listed() -> None:
    stacks = {r: rank(r, step(88, C10D)) for r in range(3)}
    text = format_groups(stacks, world_size=4)
    assert "ranks 0-2: all_reduce at train.py:88 <- step at train.py:140  [node1]" in text
    assert "rank 3: no answer (not running, or a C call holds the GIL)" in text
    assert "likely cause: rank 3, which did not answer." in text
    assert likely_cause(group_ranks(stacks)) is None


def test_two_groups_of_one_size_have_no_likely_cause() -> None:
    stacks = {0: rank(0, step(88, C10D)), 1: rank(1, step(95, BARRIER))}
    assert likely_cause(group_ranks(stacks)) is None


def test_other_threads_running_user_code_are_shown() -> None:
    holder = ThreadStack("holder", False, (Frame("/home/u/train.py", 68, "holder"),))
    text = format_groups({0: rank(0, step(72), others=(holder,))}, world_size=1, distributed=False)
    assert "other threads running user code:\n  rank 0 thread 'holder': in holder at train.py:68" in text
