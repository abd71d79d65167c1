"""The public API is what users import from `torchslurm` itself; the package layout behind it may move."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
from collections.abc import Callable

import pytest

import torchslurm

WithoutTorch = Callable[..., subprocess.CompletedProcess[str]]


def test_every_public_name_resolves_to_the_object_of_its_family_module() -> None:
    from torchslurm.jobs.spec import JobSpec
    from torchslurm.jobs.submit import Job, submit
    from torchslurm.runtime.distributed import DistContext, init, shutdown
    from torchslurm.train.config import TrainConfig
    from torchslurm.train.trainer import Trainer, seed_everything

    expected = {"init": init, "shutdown": shutdown, "DistContext": DistContext, "submit": submit, "Job": Job,
                "JobSpec": JobSpec, "Trainer": Trainer, "TrainConfig": TrainConfig,
                "seed_everything": seed_everything}
    assert set(torchslurm.__all__) == {*expected, "__version__"}
    for name, obj in expected.items():
        assert getattr(torchslurm, name) is obj, name


def test_the_public_api_has_the_shapes_the_readme_uses() -> None:
    assert "timeout_s" in inspect.signature(torchslurm.init).parameters
    spec = torchslurm.JobSpec(script="train.py", nodes=2, gpus_per_node=4)
    assert (spec.nodes, spec.gpus_per_node) == (2, 4)
    assert dataclasses.is_dataclass(torchslurm.TrainConfig)
    assert isinstance(torchslurm.__version__, str) and torchslurm.__version__.count(".") == 2


def test_an_unknown_name_is_an_attribute_error_that_names_it() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Trainr'"):
        torchslurm.Trainr  # noqa: B018


def test_job_names_import_on_a_login_node_without_torch(without_torch: WithoutTorch) -> None:
    result = without_torch("-c", "import torchslurm; torchslurm.JobSpec; torchslurm.submit; torchslurm.Job; "
                           "print(torchslurm.__version__)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == torchslurm.__version__
