"""The command that runs Python on the compute nodes (a JobSpec's `python`): `python` from PATH, a
venv's interpreter, or Python in a container (`apptainer exec --nv image.sif python`). It is read as
shell words (quotes group, nothing is expanded) and rendered word by word, each quoted. Pure.

A container runtime that is not given the GPUs hides NVIDIA's: Apptainer and Singularity pass the host's
NVIDIA devices and driver only with `--nv` (or `--nvccli`, or APPTAINER_NV / SINGULARITY_NV set), so a
GPU job would run its ranks on the CPU or fail to find NCCL's devices. AMD GPUs are seen without a flag
(their devices are under /dev, which the container shares; `--rocm` adds the host's ROCm libraries), so
a command without one is likely wrong, not certainly: a warning.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from torchslurm.errors import ConfigError, shown
from torchslurm.jobs.spelling import Spelling

CONTAINER_RUNTIMES = ("apptainer", "singularity")
GPU_PASSING_FLAGS = ("--nv", "--nvccli", "--rocm")  # NVIDIA's driver and devices; AMD's ROCm libraries
NV_VARIABLES = frozenset({"APPTAINER_NV", "SINGULARITY_NV"})  # Apptainer reads both; SingularityCE the second
EXAMPLE = "apptainer exec --nv image.sif python"


def python_words(python: str) -> list[str]:
    """The command's words, as a shell would split them (for a `python` that python_problem passed)."""
    return shlex.split(python)


def python_problem(python: str, sp: Spelling) -> ConfigError | None:
    """Why `python` cannot start Python on the nodes: quotes left open, or a first word srun would read as
    one of its own options. (An empty one is spec's general check.)"""
    try:
        words = shlex.split(python)
    except ValueError as exc:
        return ConfigError(f"{sp.name('python')}={shown(python)} cannot be read as a command ({exc}).",
                           f"close the quote, or give a path, e.g. {sp.setting('python', '/opt/venv/bin/python')} "
                           f"or {sp.setting('python', EXAMPLE)}.")
    if python.strip() and not (words and words[0]):  # '' or "" as the program
        return ConfigError(f"{sp.name('python')}={shown(python)} names no program to run.",
                           f"give a path or a command, e.g. {sp.setting('python', 'python3')}.")
    if words and words[0].startswith("-"):
        as_path = shlex.join(["./" + words[0], *words[1:]])
        return ConfigError(f"{sp.name('python')}={shown(python)} starts with '-', so it would be read as an option, "
                           "not a path.", f"write it as a path: {sp.setting('python', as_path)}.")
    return None


def container_without_gpus(python: str, env: Mapping[str, str]) -> str | None:
    """The container runtime that `python` runs Python in without the GPUs (`apptainer exec image.sif
    python` with no --nv), or None: not such a runtime, the flag given, or the variable that sets it in
    the job's env."""
    try:
        words = shlex.split(python)
    except ValueError:
        return None
    return runtime_without_gpus(words, any(_set(env.get(name)) for name in NV_VARIABLES))


def runtime_without_gpus(words: Sequence[str], variable_set: bool = False) -> str | None:
    """The Apptainer/Singularity that a command's words run a program in (`apptainer exec IMAGE CMD`,
    after a wrapper or srun's options too) with no --nv, --nvccli or --rocm, unless `variable_set`
    (APPTAINER_NV or SINGULARITY_NV is set for it); else None."""
    at = _subcommand(words)
    if at is None or variable_set or any(word in GPU_PASSING_FLAGS for word in words[at + 1:]):
        return None
    return next(Path(word).name for word in reversed(words[:at]) if Path(word).name in CONTAINER_RUNTIMES)


def with_gpus(python: str) -> str:
    """`python` with --nv after the runtime's subcommand (`apptainer exec --nv image.sif python`); as it is
    without one."""
    words = shlex.split(python)
    at = _subcommand(words)
    return python if at is None else shlex.join([*words[:at + 1], "--nv", *words[at + 1:]])


def _subcommand(words: Sequence[str]) -> int | None:
    """Where `exec` or `run` of the first Apptainer/Singularity in `words` is (after its global options:
    `apptainer --quiet exec`), or None."""
    for i, word in enumerate(words):
        if Path(word).name in CONTAINER_RUNTIMES:
            at = next((j for j in range(i + 1, len(words)) if not words[j].startswith("-")), None)
            return at if at is not None and words[at] in ("exec", "run") else None
    return None


def _set(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no")
