"""Slurm's map_gpu/mask_gpu bind lists: parsed as srun applies them, and overlapping lists never put
two tasks of a node on one GPU. The environments are what the sandbox's slurmd (22.05) set."""

from __future__ import annotations

import pytest

from torchslurm.errors import ConfigError
from torchslurm.runtime.gpubind import agree, assign, bind_list, gpu_sets, task_slot


@pytest.mark.parametrize(("spec", "tasks", "expected"), [
    ("map_gpu:3,1", 2, [(3,), (1,)]),
    ("map_gpu:0x2,1", 3, [(2,), (1,), (2,)]),             # reused past its end; hex with 0x
    ("map_gpu:0*2,1*2", 4, [(0,), (0,), (1,), (1,)]),     # entry*N
    ("mask_gpu:0x3,0xc", 2, [(0, 1), (2, 3)]),
    ("mask_gpu:3,6", 2, [(0, 1), (1, 2)]),                 # masks are hex, with or without 0x
])
def test_gpu_sets_follow_man_srun(spec: str, tasks: int, expected: list[tuple[int, ...]]) -> None:
    assert gpu_sets(spec, tasks) == expected


def test_each_task_takes_the_first_gpu_no_lower_task_took() -> None:
    assert assign([(0, 1), (0, 1), (2, 3), (2, 3)]) == [0, 1, 2, 3]
    assert assign([(0, 1), (1, 2)]) == [0, 1]
    assert assign([(1,), (1,)]) == [1, None]
    assert assign([["GPU-b", "GPU-a"], ["GPU-b", "GPU-a"]]) == ["GPU-b", "GPU-a"]  # in each view's order


def task(localid: int, visible: str, bind: str) -> dict[str, str]:
    return {"SLURM_STEP_ID": "0", "SLURM_LOCALID": str(localid), "CUDA_VISIBLE_DEVICES": visible,
            "SLURMD_TRES_BIND": bind, "SLURM_GPUS_ON_NODE": "4"}


def test_overlapping_masks_give_every_task_its_own_gpu() -> None:
    """`srun -n4 --gpus-per-node=4 --gpu-bind=mask_gpu:0x3,0x3,0xc,0xc`: tasks 0 and 1 both see 0,1."""
    bind = "gpu:mask_gpu:0x3,0x3,0xc,0xc"
    views = ["0,1", "0,1", "2,3", "2,3"]
    slots = [task_slot(task(i, v, bind), i, 4, 2) for i, v in enumerate(views)]
    physical = [views[i].split(",")[slot[0]] for i, slot in enumerate(slots) if slot is not None]
    assert physical == ["0", "1", "2", "3"]
    assert "local task 1 takes GPU 1 of its 0,1" in str(slots[1])


def test_a_list_that_leaves_a_task_without_a_gpu_is_refused_not_shared() -> None:
    """`--gpu-bind=map_gpu:1,1,2,2`: Slurm shows tasks 0 and 1 the same single GPU."""
    bind = "gpu:map_gpu:1,1,2,2"
    assert task_slot(task(0, "1", bind), 0, 4, 1) == (0, "SLURMD_TRES_BIND=gpu:map_gpu:1,1,2,2: local task 0 "
                                                         "takes GPU 1 of its 1")
    with pytest.raises(ConfigError) as info:
        task_slot(task(1, "1", bind), 1, 4, 1)
    assert "binds local task 1 to GPU(s) 1, which local tasks 0, 1 of this node share" in info.value.message
    assert info.value.hint and "--gpus-per-task=1" in info.value.hint


@pytest.mark.parametrize("environ", [
    {"SLURMD_TRES_BIND": "gpu:per_task:1"}, {"SLURMD_TRES_BIND": "gpu:closest"}, {},
    {"SLURM_GPU_BIND": "verbose,mask_gpu:zz"},  # unreadable: the caller's rule applies
])
def test_no_list_or_an_unreadable_one_leaves_the_choice_to_the_caller(environ: dict[str, str]) -> None:
    assert task_slot({**environ, "SLURM_LOCALID": "0"}, 0, 2, 1) is None


def test_bind_list_reads_either_variable() -> None:
    assert bind_list({"SLURM_GPU_BIND": "verbose,map_gpu:0,1"}) == ("SLURM_GPU_BIND=verbose,map_gpu:0,1",
                                                                    "map_gpu:0,1")
    assert bind_list({"SLURMD_TRES_BIND": "gpu:single:1"}) is None


def test_tasks_with_views_no_variable_states_agree_through_a_real_store() -> None:
    """`--gpu-bind=closest` with tasks spread over sockets cyclically (block:cyclic, srun's default): tasks 0
    and 2 see the first socket's GPUs, 1 and 3 the second's. Each task's provisional index would be wrong for
    some layout; agreeing through the job's TCPStore gives each one its own GPU, whatever the layout."""
    from concurrent.futures import ThreadPoolExecutor
    from datetime import timedelta

    from torch.distributed import TCPStore

    views = [["GPU-a", "GPU-b"], ["GPU-c", "GPU-d"], ["GPU-a", "GPU-b"], ["GPU-c", "GPU-d"]]
    server = TCPStore("127.0.0.1", 0, 5, is_master=True, timeout=timedelta(seconds=20), wait_for_workers=False)

    def task(local: int) -> int | None:
        client = TCPStore("127.0.0.1", server.port, 5, is_master=False, timeout=timedelta(seconds=20))
        return agree(client, "gpu/node1", local, 4, views[local])

    with ThreadPoolExecutor(4) as pool:
        indexes = list(pool.map(task, [3, 2, 1, 0]))[::-1]  # the last task to arrive first
    assert [views[t][i] for t, i in enumerate(indexes) if i is not None] == ["GPU-a", "GPU-c", "GPU-b", "GPU-d"]
    with ThreadPoolExecutor(2) as pool:
        crowded = list(pool.map(lambda t: agree(TCPStore("127.0.0.1", server.port, is_master=False,
                                                          timeout=timedelta(seconds=20)), "gpu/node2", t, 2, ["GPU-x"]),
                                [0, 1]))
    assert crowded == [0, None]  # the second task is left without a GPU: init() refuses it


@pytest.mark.parametrize(("spec", "expected"), [
    ("map_gpu:10,0x10", [(10,), (16,)]),         # decimal unless it says 0x
    ("mask_gpu:0x10,10,0X3", [(4,), (4,), (0, 1)]),  # masks are hex, with or without 0x
])
def test_gpu_ids_past_nine_read_in_their_base(spec: str, expected: list[tuple[int, ...]]) -> None:
    assert gpu_sets(spec, len(expected)) == expected


def test_a_list_with_a_second_colon_is_unreadable() -> None:
    with pytest.raises(ValueError):
        gpu_sets("map_gpu:1:2", 1)
    assert task_slot({"SLURM_GPU_BIND": "map_gpu:1:2"}, 0, 1, 1) is None


def test_a_task_id_outside_the_nodes_tasks_leaves_the_choice_to_the_caller() -> None:
    environ = {"SLURM_GPU_BIND": "map_gpu:0,1"}
    assert task_slot(environ, 2, 2, 1) is None and task_slot(environ, -1, 2, 1) is None
    assert task_slot(environ, 1, 2, 1) == (0, "SLURM_GPU_BIND=map_gpu:0,1: local task 1 takes GPU 1 of its 1")


def test_a_task_left_without_a_gpu_is_refused_with_the_whole_text() -> None:
    bind = "gpu:mask_gpu:0x3,0x3,0x3"
    with pytest.raises(ConfigError) as info:
        task_slot(task(2, "0,1", bind), 2, 3, 2)
    assert str(info.value) == (
        "SLURMD_TRES_BIND=gpu:mask_gpu:0x3,0x3,0x3 binds local task 2 to GPU(s) 0,1, which local tasks 0, 1, 2 of "
        "this node share: 3 tasks for 2 GPU(s), so a rank would have no GPU of its own, and two NCCL ranks on one GPU "
        "hang or crash. HINT: give every task its own GPU (--gpus-per-task=1 or --gpu-bind=per_task:1), or a "
        "map_gpu/mask_gpu list with one GPU for each task of a node.")


def test_views_are_passed_whole_even_with_blanks_in_a_name() -> None:
    class Store:
        def __init__(self) -> None:
            self.values: dict[str, bytes] = {}

        def set(self, key: str, value: str) -> None:
            self.values[key] = value.encode()

        def get(self, key: str) -> bytes:
            return self.values[key]

    assert agree(Store(), "gpu/node0", 0, 1, ["GPU a", "GPU b"]) == 0
