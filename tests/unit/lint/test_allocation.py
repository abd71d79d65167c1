"""The allocation as the #SBATCH directives fix it (lint/allocation.py)."""

from __future__ import annotations

import pytest

from torchslurm.lint.allocation import gpus_per_node, leading_int, step_nodes, tasks_per_node
from torchslurm.lint.parse import parse


@pytest.mark.parametrize(("directives", "gpus", "tasks"), [
    ({"gres": "gpu:4"}, 4, None), ({"gres": "gpu:a100:2,tmp:10G"}, 2, None), ({"gpus-per-node": "8"}, 8, None),
    ({"gpus-per-task": "1", "ntasks-per-node": "4"}, 4, 4), ({"gpus": "8", "nodes": "2"}, 4, None),
    ({"ntasks": "16", "nodes": "4"}, None, 4),
])


def test_resource_reading(directives: dict[str, str], gpus: int | None, tasks: int | None) -> None:
    assert (gpus_per_node(directives), tasks_per_node(directives)) == (gpus, tasks)



@pytest.mark.parametrize(("directives", "gpus"), [
    ({"gpus-per-node": "a100:4"}, 4), ({"gres": "tmp:10G,gpu:2"}, 2), ({"gres": "gpu"}, 1),
    ({"gres": "gpu:a100"}, 1),  # a type and no count: one (sbatch(1), --gres=name[[:type]:count])
    ({"gres": "gpu:a100:0"}, 0), ({"gpus": "a100:8", "nodes": "2"}, 4), ({"gpus": "8"}, 8), ({}, None),
])
def test_gpus_per_node_in_every_spelling(directives: dict[str, str], gpus: int | None) -> None:
    found = gpus_per_node(directives)
    assert found == gpus and type(found) is type(gpus)


@pytest.mark.parametrize(("directives", "tasks"), [
    ({"ntasks": "9", "nodes": "2"}, 5),  # block layout: 5 on the first node, 4 on the second
    ({"ntasks": "8", "nodes": "2"}, 4), ({"ntasks": "3"}, 1), ({"ntasks-per-node": "2", "ntasks": "9"}, 2), ({}, None),
])
def test_tasks_per_node_is_the_most_a_node_gets(directives: dict[str, str], tasks: int | None) -> None:
    found = tasks_per_node(directives)
    assert found == tasks and type(found) is type(tasks)


def test_leading_int_takes_up_to_18_digits() -> None:
    assert (leading_int("9" * 18 + "x"), leading_int("9" * 19), leading_int("2-4"), leading_int(None)) == (
        10 ** 18 - 1, None, 2, None)


@pytest.mark.parametrize(("launch", "nodes"), [
    ("srun python t.py", 4), ("srun --nodes=2-4 python t.py", 2), ("srun -N 3 -n 2 python t.py", 2),
    ("python t.py", 1),
])
def test_a_step_spans_the_nodes_srun_is_given(launch: str, nodes: int) -> None:
    (ln,) = parse(f"#!/bin/bash\n{launch}\n").launches
    assert step_nodes(ln, 4) == nodes
