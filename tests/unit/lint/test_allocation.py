"""The allocation as the #SBATCH directives fix it (lint/allocation.py)."""

from __future__ import annotations

import pytest

from torchslurm.lint.allocation import gpus_per_node, tasks_per_node


@pytest.mark.parametrize(("directives", "gpus", "tasks"), [
    ({"gres": "gpu:4"}, 4, None), ({"gres": "gpu:a100:2,tmp:10G"}, 2, None), ({"gpus-per-node": "8"}, 8, None),
    ({"gpus-per-task": "1", "ntasks-per-node": "4"}, 4, 4), ({"gpus": "8", "nodes": "2"}, 4, None),
    ({"ntasks": "16", "nodes": "4"}, None, 4),
])


def test_resource_reading(directives: dict[str, str], gpus: int | None, tasks: int | None) -> None:
    assert (gpus_per_node(directives), tasks_per_node(directives)) == (gpus, tasks)

