"""A rank's stacks as data: taken from another thread while the main one waits, and sent as JSON."""

from __future__ import annotations

import threading

from torchslurm.runtime.stackdump import OWN_ROOT, Frame, RankStack, collective_of, frame_kind, snapshot


def test_frame_kinds_by_folder() -> None:
    roots = ("/usr/lib/python3.11/", "/venv/lib/python3.11/site-packages/")
    assert frame_kind("/home/u/train.py", roots, "/src/torchslurm/") == "user"
    assert frame_kind("/src/torchslurm/train/trainer.py", roots, "/src/torchslurm/") == "own"
    assert frame_kind("/venv/lib/python3.11/site-packages/torch/_tensor.py", roots, "/src/torchslurm/") == "library"
    assert frame_kind("<frozen runpy>", roots, "/src/torchslurm/") == "library"


def test_collective_of_a_stack() -> None:
    c10d = Frame("/t/torch/distributed/distributed_c10d.py", 1, "all_reduce", "library")
    private = Frame("/t/torch/distributed/distributed_c10d.py", 2, "_check_single_tensor", "library")
    backward = Frame("/t/torch/autograd/graph.py", 3, "_engine_run_backward", "library")
    assert collective_of([c10d, private]) == "all_reduce"
    assert collective_of([backward]) == "backward"
    assert collective_of([backward], distributed=False) is None


def test_snapshot_sees_a_thread_blocked_in_a_wait_with_its_line() -> None:
    release = threading.Event()

    def blocked() -> None:
        release.wait(30)  # the line the snapshot must name

    worker = threading.Thread(target=blocked, name="blocked-worker")
    worker.start()
    try:
        stack = snapshot(rank=2, world_size=4, collectives=7, steps=3, skip_thread=threading.get_ident())
    finally:
        release.set()
        worker.join()
    thread = next(t for t in stack.threads if t.name == "blocked-worker")
    mine = next(f for f in thread.frames if f.func.endswith("blocked"))
    assert (mine.kind, mine.file, mine.line) == ("user", __file__, blocked.__code__.co_firstlineno + 1)
    assert thread.frames[-1].func == "Condition.wait" and thread.frames[-1].kind == "library"
    assert not any(t.main for t in stack.threads)  # the asking (main) thread is left out
    assert (stack.rank, stack.world_size, stack.collectives, stack.steps) == (2, 4, 7, 3)
    assert RankStack.from_json(stack.to_json()) == stack


def test_torchslurm_is_its_own_kind() -> None:
    assert frame_kind(OWN_ROOT + "train/hang.py", (), OWN_ROOT) == "own"
