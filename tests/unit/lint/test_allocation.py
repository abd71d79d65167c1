"""A script's allocation from its directives, and a launch line's own srun layout."""

from __future__ import annotations

import pytest

from torchslurm.lint.allocation import (
    Allocation,
    gpus_per_node,
    leading_int,
    step_nodes,
    step_tasks_per_node,
    tasks_per_node,
)
from torchslurm.lint.parse import parse


@pytest.mark.parametrize(("directives", "gpus", "tasks"), [
    ({"gres": "gpu:4"}, 4, None), ({"gres": "gpu:a100:2,tmp:10G"}, 2, None), ({"gpus-per-node": "8"}, 8, None),
    ({"gpus-per-task": "1", "ntasks-per-node": "4"}, 4, 4), ({"gpus": "8", "nodes": "2"}, 4, None),
    ({"ntasks": "16", "nodes": "4"}, None, 4),
])
def test_resource_reading(directives: dict[str, str], gpus: int | None, tasks: int | None) -> None:
    assert (gpus_per_node(directives), tasks_per_node(directives)) == (gpus, tasks)


def test_the_jobs_layout_with_slurms_defaults() -> None:
    assert Allocation.of(parse("#!/bin/bash\n")) == Allocation(1, 1, None, 1)
    script = "#!/bin/bash\n#SBATCH --nodes=2-4\n#SBATCH --ntasks-per-node=4\n#SBATCH --gres=gpu:4\n"
    found = Allocation.of(parse(script))
    assert found == Allocation(2, 4, 4, 8) and found.several_tasks
    assert leading_int("2-4") == 2 and leading_int("$N") is None


def test_an_srun_step_layout_of_its_own() -> None:
    script = parse("#!/bin/bash\n#SBATCH --nodes=4\nsrun -N2 --ntasks=6 python a.py\npython b.py\n")
    in_step, alone = script.launches
    assert (step_nodes(in_step, 4), step_tasks_per_node(in_step, 4)) == (2, 3)  # block layout: 3 + 3
    assert step_nodes(alone, 4) == 1 and step_tasks_per_node(alone, 4) is None
