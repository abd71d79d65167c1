"""The `torchslurm stacks` responder in this process: real files, a real thread answering requests."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from torchslurm.runtime.stackwatch import (
    FOLDER,
    REQUEST,
    StackWatch,
    answers,
    ask,
    collect,
    job_dir,
    rank_file,
    registered,
    watching,
)


def test_a_rank_registers_and_answers_a_request_with_its_stacks(tmp_path: Path) -> None:
    watch = StackWatch(rank=3, world_size=4, collectives=lambda: 12, poll_s=0.05)
    assert watch.add(tmp_path)
    assert watching([tmp_path, tmp_path / "elsewhere"]) == [tmp_path]
    assert registered(tmp_path)[3]["request"] is None
    request = ask(tmp_path)
    answered: list[bool] = []
    for _ in range(2):  # from a thread, as the responder does: the test's own (main) thread is seen waiting
        asking = threading.Thread(target=lambda: answered.append(watch.answer(tmp_path)))
        asking.start()
        asking.join()
    assert answered == [True, False]  # once per request
    stack = answers(tmp_path, request)[3]
    assert (stack.rank, stack.world_size, stack.collectives) == (3, 4, 12)
    assert any(f.func.endswith("test_a_rank_registers_and_answers_a_request_with_its_stacks")
               for t in stack.threads for f in t.frames)


def test_collect_waits_for_the_running_thread_and_stop_unregisters(tmp_path: Path) -> None:
    watches = [StackWatch(rank, 2, poll_s=0.05) for rank in range(2)]
    for watch in watches:
        watch.add(tmp_path)
        watch.start()
    try:
        got, world = collect(tmp_path, wait_s=20)
    finally:
        for watch in watches:
            watch.stop()
    assert (sorted(got), world) == ([0, 1], 2)
    assert not rank_file(tmp_path, 0).exists() and not rank_file(tmp_path, 1).exists()


def test_a_rank_that_does_not_answer_is_left_out_after_the_wait(tmp_path: Path) -> None:
    StackWatch(0, 2).add(tmp_path)  # registered, never started: a rank that cannot answer
    ticks = iter(range(100))
    got, world = collect(tmp_path, wait_s=3, sleep=lambda _: None, clock=lambda: float(next(ticks)))
    assert (got, world) == ({}, 2)


def test_a_half_written_answer_counts_as_not_yet(tmp_path: Path) -> None:
    watch = StackWatch(1, 2)
    watch.add(tmp_path)
    request = ask(tmp_path)
    rank_file(tmp_path, 1).write_text('{"rank": 1, "request": "' + request + '", "sta')
    assert answers(tmp_path, request) == {}


def test_an_unwritable_folder_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert not StackWatch(0, 1).add(tmp_path / "file" / "below")


def test_the_job_folder_and_the_request_file_are_created_once_and_kept(tmp_path: Path) -> None:
    folder = job_dir("4242", tmp_path)
    assert folder == tmp_path / ".torchslurm" / "jobs" / "4242"
    StackWatch(0, 2).add(folder)
    (folder / FOLDER / REQUEST).write_text("old\n")
    StackWatch(1, 2).add(folder)  # a later rank does not wipe a request
    assert (folder / FOLDER / REQUEST).read_text() == "old\n"
    assert json.loads(rank_file(folder, 1).read_text())["world_size"] == 2


def test_the_thread_survives_a_removed_folder(tmp_path: Path) -> None:
    watch = StackWatch(0, 1, poll_s=0.01)
    watch.add(tmp_path / "gone")
    (tmp_path / "gone" / FOLDER / REQUEST).unlink()
    (tmp_path / "gone" / FOLDER / "rank-00000.json").unlink()
    (tmp_path / "gone" / FOLDER).rmdir()
    watch.start()
    threading.Event().wait(0.1)
    assert watch._thread is not None and watch._thread.is_alive()
    watch.stop()
