"""Slurm's explicit GPU bind lists, `--gpu-bind=map_gpu:…` and `--gpu-bind=mask_gpu:…`, read as srun
applies them (man srun, --gpu-bind): one list for every node, entry i for the node's local task i,
reused when the tasks outnumber the entries, `entry*N` repeating an entry. map_gpu entries are GPU ids
(decimal, or hex with 0x), mask_gpu entries are hex bit masks of GPU ids.

Lists may overlap: `mask_gpu:0x3,0x3,0xc,0xc` shows tasks 0 and 1 the same two GPUs. Taking "the
first visible GPU" would put both on one GPU, so every task takes the first GPU of its list that no
lower local task took; a task left without one is an error, never a shared GPU. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from torchslurm.errors import ConfigError

T = TypeVar("T")


class KeyValueStore(Protocol):
    """What `agree` needs of a torch.distributed store."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...

_KINDS = ("map_gpu:", "mask_gpu:")


def bind_list(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable=value as Slurm set it, the `map_gpu:…`/`mask_gpu:…` list) of this srun task, or None."""
    for name in ("SLURMD_TRES_BIND", "SLURM_GPU_BIND"):
        value = environ.get(name, "")
        spec = value.removeprefix("gpu:").removeprefix("verbose,")
        if spec.startswith(_KINDS):
            return f"{name}={value}", spec
    return None


def gpu_sets(spec: str, tasks: int) -> list[tuple[int, ...]]:
    """The GPU ids each of a node's `tasks` local tasks is bound to by `spec` (`map_gpu:…` or `mask_gpu:…`)."""
    kind, _, listed = spec.partition(":")
    entries: list[frozenset[int]] = []
    for item in listed.split(","):
        text, _, times = item.strip().partition("*")
        ids = _mask_ids(text) if kind == "mask_gpu" else frozenset({int(text, 16 if text.lower().startswith("0x")
                                                                     else 10)})
        entries += [ids] * (int(times) if times else 1)
    return [tuple(sorted(entries[task % len(entries)])) for task in range(tasks)]


def _mask_ids(text: str) -> frozenset[int]:
    bits = int(text, 16)  # with or without 0x
    return frozenset(i for i in range(bits.bit_length()) if bits >> i & 1)


def assign(views: Sequence[Sequence[T]]) -> list[T | None]:
    """Each task's GPU, in local task order: the first of its view that no lower task took (None: all of
    them were taken)."""
    taken: set[T] = set()
    chosen: list[T | None] = []
    for view in views:
        free = [gpu for gpu in view if gpu not in taken]
        chosen.append(free[0] if free else None)
        taken.update(free[:1])
    return chosen


def agree(store: KeyValueStore, key: str, local_task: int, local_tasks: int, view: Sequence[str]) -> int | None:
    """Where the views of a node's tasks may overlap in ways no variable states (`--gpu-bind=closest`,
    `--accel-bind=g`: the GPUs near each task's CPUs), the node's tasks tell each other their views
    (GPU UUIDs) through the job's store and each takes its GPU by `assign`. The index among `view`,
    or None when every GPU of it went to a lower task. `store.get` waits until the key is set."""
    store.set(f"{key}/{local_task}", "\n".join(view))
    views = [store.get(f"{key}/{task}").decode().split("\n") for task in range(local_tasks)]
    gpu = assign(views)[local_task]
    return None if gpu is None else list(view).index(gpu)


def task_slot(environ: Mapping[str, str], local_task: int, tasks: int, visible: int) -> tuple[int, str] | None:
    """(index among this task's `visible` devices, why) under a bind list; None without a list or when
    the list does not describe what this task sees (then the caller's rule applies)."""
    found = bind_list(environ)
    if found is None or not 0 <= local_task < tasks:
        return None
    setting, spec = found
    try:
        sets = gpu_sets(spec, tasks)
    except (ValueError, IndexError):
        return None
    mine = sets[local_task]
    if len(mine) != visible:
        return None
    gpu = assign(sets)[local_task]
    if gpu is None:
        sharing = [task for task, ids in enumerate(sets) if set(ids) & set(mine)]
        raise ConfigError(
            f"{setting} binds local task {local_task} to GPU(s) {','.join(map(str, mine))}, which local tasks "
            f"{', '.join(map(str, sharing))} of this node share: {tasks} tasks for {len(set().union(*sets))} GPU(s), "
            "so a rank would have no GPU of its own, and two NCCL ranks on one GPU hang or crash.",
            "give every task its own GPU (--gpus-per-task=1 or --gpu-bind=per_task:1), or a map_gpu/mask_gpu "
            "list with one GPU for each task of a node.")
    return mine.index(gpu), f"{setting}: local task {local_task} takes GPU {gpu} of its {','.join(map(str, mine))}"
