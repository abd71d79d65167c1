"""jobs.interpreter: a job's python as a command of several words (a container's), and a container
runtime that would hide the GPUs (the sbatch lines they make: test_sbatch.py; Slurm running them:
tests/cluster/test_jobs.py)."""

from __future__ import annotations

import pytest

from torchslurm.errors import ConfigError
from torchslurm.jobs.findings import validate
from torchslurm.jobs.interpreter import (
    container_without_gpus,
    python_problem,
    python_words,
    runtime_without_gpus,
    with_gpus,
)
from torchslurm.jobs.spec import JobSpec
from torchslurm.jobs.spelling import SPEC_FILE, command_line

FLAGS = command_line(["python"])


@pytest.mark.parametrize(("python", "words"), [
    ("python", ["python"]),
    ("/opt/venv/bin/python3", ["/opt/venv/bin/python3"]),
    ("apptainer exec --nv -B /data:/data image.sif python", ["apptainer", "exec", "--nv", "-B", "/data:/data",
                                                              "image.sif", "python"]),
    ("apptainer exec '/images/my image.sif' python", ["apptainer", "exec", "/images/my image.sif", "python"]),
    ("env A=$HOME python", ["env", "A=$HOME", "python"]),  # nothing expanded: the job script quotes each word
])
def test_the_command_is_read_as_shell_words(python: str, words: list[str]) -> None:
    assert python_words(python) == words
    assert python_problem(python, SPEC_FILE) is None


@pytest.mark.parametrize(("python", "sp", "text"), [
    ("apptainer exec 'image.sif python", SPEC_FILE,
     "python=\"apptainer exec 'image.sif python\" cannot be read as a command (No closing quotation). HINT: close "
     "the quote, or give a path, e.g. python: /opt/venv/bin/python or python: apptainer exec --nv image.sif python."),
    ("apptainer exec 'image.sif python", FLAGS,
     "--python=\"apptainer exec 'image.sif python\" cannot be read as a command (No closing quotation). HINT: close "
     "the quote, or give a path, e.g. --python /opt/venv/bin/python or --python 'apptainer exec --nv image.sif "
     "python'."),
    ("-u", SPEC_FILE, "python='-u' starts with '-', so it would be read as an option, not a path. HINT: write it as "
     "a path: python: ./-u."),
    ("'-u' x", FLAGS, "--python=\"'-u' x\" starts with '-', so it would be read as an option, not a path. HINT: "
     "write it as a path: --python './-u x'."),
    ("'' python", SPEC_FILE, "python=\"'' python\" names no program to run. HINT: give a path or a command, e.g. "
     "python: python3."),
])
def test_a_command_that_cannot_start_python_is_refused_whole(python: str, sp: object, text: str) -> None:
    problem = python_problem(python, sp)  # type: ignore[arg-type]
    assert problem is not None and str(problem) == text
    with pytest.raises(ConfigError, match="python="):
        JobSpec(script="t.py", python=python)


@pytest.mark.parametrize(("python", "env", "runtime"), [
    ("apptainer exec image.sif python", {}, "apptainer"),
    ("/usr/bin/singularity run -B /d image.sif", {}, "singularity"),
    ("apptainer --quiet exec image.sif python3", {"APPTAINER_NV": "0"}, "apptainer"),
    ("apptainer exec --nv image.sif python", {}, None),
    ("apptainer exec --nvccli image.sif python", {}, None),
    ("singularity exec --rocm image.sif python", {}, None),
    ("apptainer exec image.sif python", {"APPTAINER_NV": "1"}, None),
    ("singularity exec image.sif python", {"SINGULARITY_NV": "true"}, None),
    ("apptainer shell image.sif", {}, None),  # not a command that runs python
    ("python", {}, None),
    ("env A=1 apptainer exec image.sif python", {}, "apptainer"),  # after a wrapper too
    ("apptainer exec python", {}, "apptainer"),  # (no image: apptainer's own error)
    ("exec apptainer", {}, None),
    ("apptainer exec 'image.sif", {}, None),  # refused as unreadable anyway
    ("", {}, None),
])
def test_a_container_runtime_without_the_gpus_is_found(python: str, env: dict[str, str], runtime: str | None) -> None:
    assert container_without_gpus(python, env) == runtime


@pytest.mark.parametrize(("value", "set_"), [
    ("1", True), ("yes", True), ("true", True), (" 1 ", True),
    ("", False), (" ", False), ("0", False), ("false", False), ("False", False), ("NO", False), ("no", False),
])
def test_the_variable_that_gives_the_gpus_counts_unless_it_says_no(value: str, set_: bool) -> None:
    for name in ("APPTAINER_NV", "SINGULARITY_NV"):
        found = container_without_gpus("apptainer exec image.sif python", {name: value})
        assert found == (None if set_ else "apptainer")


def test_only_the_subcommands_own_options_give_the_gpus() -> None:
    assert runtime_without_gpus(["srun", "-K", "apptainer", "exec", "image.sif", "python"]) == "apptainer"
    assert runtime_without_gpus(["apptainer", "exec", "image.sif", "python"], variable_set=True) is None
    assert runtime_without_gpus(["apptainer", "--nv", "exec", "image.sif", "python"]) == "apptainer"  # not global


def test_the_fix_puts_nv_after_the_subcommand() -> None:
    assert with_gpus("python3") == "python3"  # no container: nothing to add
    assert with_gpus("apptainer exec -B /data image.sif python") == "apptainer exec --nv -B /data image.sif python"
    assert with_gpus("apptainer --quiet run 'my image.sif'") == "apptainer --quiet run --nv 'my image.sif'"


def test_a_gpu_job_in_a_container_without_nv_is_a_warning_in_the_words_it_was_given_in() -> None:
    spec = JobSpec(script="t.py", nodes=2, gpus_per_node=4, python="apptainer exec -B /data image.sif python")
    found = [f for f in validate(spec) if f.code == "container-without-gpus"]
    assert [(f.severity, f.message, f.hint) for f in found] == [(
        "warning",
        "python='apptainer exec -B /data image.sif python' runs Python in apptainer without --nv: on NVIDIA GPUs the "
        "container sees none of the 4 per node, so the ranks would find no CUDA device (AMD GPUs need no flag).",
        "add --nv: python: apptainer exec --nv -B /data image.sif python (or set APPTAINER_NV=1 in env); on AMD "
        "GPUs, --rocm or nothing")]
    flagged = [f for f in validate(spec, spelling=FLAGS) if f.code == "container-without-gpus"]
    assert flagged[0].hint == ("add --nv: --python 'apptainer exec --nv -B /data image.sif python' (or set "
                               "APPTAINER_NV=1 in env); on AMD GPUs, --rocm or nothing")
    cpu_job = JobSpec(script="t.py", python="apptainer exec image.sif python")
    assert not [f for f in validate(cpu_job) if f.code == "container-without-gpus"]
    with_env = JobSpec(script="t.py", gpus_per_node=4, python="apptainer exec image.sif python",
                       env={"APPTAINER_NV": "1"})
    assert not [f for f in validate(with_env) if f.code == "container-without-gpus"]
