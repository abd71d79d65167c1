"""The public API is what users import from `torchslurm` itself; the package layout behind it may move."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import pydoc
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import torchslurm

WithoutTorch = Callable[..., subprocess.CompletedProcess[str]]


def test_every_public_name_resolves_to_the_object_of_its_family_module() -> None:
    from torchslurm.jobs.spec import JobSpec
    from torchslurm.jobs.submit import Job, submit
    from torchslurm.runtime.distributed import DistContext, init, shutdown
    from torchslurm.train.checkpoint.weights import load_model
    from torchslurm.train.config import TrainConfig
    from torchslurm.train.trainer import Trainer, seed_everything

    expected = {"init": init, "shutdown": shutdown, "DistContext": DistContext, "submit": submit, "Job": Job,
                "JobSpec": JobSpec, "Trainer": Trainer, "TrainConfig": TrainConfig,
                "seed_everything": seed_everything, "load_model": load_model}
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


# What the previous release's README, docs and examples import from modules below the package: users
# copied these lines, so they keep working whatever moves behind them.
PREVIOUS_RELEASE_IMPORTS = {
    "torchslurm.train.trainer": ["FitResult", "TrainConfig", "Trainer", "seed_everything"],
    "torchslurm.train.config": ["TrainConfig"],
    "torchslurm.errors": ["TorchSlurmError", "ConfigError", "CheckpointError"],
    "torchslurm.cli.train": ["add_arguments", "from_arguments"],
    "torchslurm.train.fsdp": ["shard_model"],
    "torchslurm.train.text": ["stdlib_text"],
    "torchslurm.train.models": ["GPT", "SimpleConvNet", "SimpleModel"],
    "torchslurm.train.data": [],
    "torchslurm.train.tasks": [],
}
_IMPORT = re.compile(r"^\s*from (torchslurm[\w.]*) import ([\w, ]+)$", re.M)
_ROOT = Path(__file__).parents[2]


def documented_imports() -> dict[str, set[str]]:
    """Every `from torchslurm… import …` line in the README, docs/ and examples/ today."""
    found: dict[str, set[str]] = {}
    for path in [_ROOT / "README.md", *(_ROOT / "docs").rglob("*.md"), *(_ROOT / "examples").rglob("*.py")]:
        for module, names in _IMPORT.findall(path.read_text()):
            found.setdefault(module, set()).update(name.strip() for name in names.split(",") if name.strip())
    return found


@pytest.mark.parametrize("module", sorted({*PREVIOUS_RELEASE_IMPORTS, *documented_imports()}))
def test_names_users_import_from_modules_still_resolve(module: str) -> None:
    loaded = importlib.import_module(module)
    names = {*PREVIOUS_RELEASE_IMPORTS.get(module, ()), *documented_imports().get(module, ())}
    missing = sorted(name for name in names if not hasattr(loaded, name)
                     and importlib.util.find_spec(f"{module}.{name}") is None)
    assert not missing, f"{module} no longer has {missing}"


def test_help_of_the_public_api_never_prints_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No live mapping (os.environ) as a default in a public signature: help() would print it whole."""
    monkeypatch.setenv("TORCHSLURM_TEST_SECRET", "value-that-help-must-not-show")
    for name in torchslurm.__all__:
        if name != "__version__":
            assert "value-that-help-must-not-show" not in pydoc.render_doc(getattr(torchslurm, name)), name
