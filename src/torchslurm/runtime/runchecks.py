"""What `torchslurm run` is asked to start, checked before any rank starts (and for --dry-run): a
Python file or a folder with __main__.py (not a config file, nor a hand-written sbatch script), a module
`python -m` finds, a positive --nproc, and run's own flags given after the script (the script gets them).
`submit` asks the same of a job's script.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path

from torchslurm.errors import ConfigError, below_minimum

RUN_FLAGS = ("--nproc", "--max-restarts", "--dry-run")
_DATA_FILES = {".yaml": "YAML", ".yml": "YAML", ".json": "JSON", ".toml": "TOML"}


def check_run_options(script: str, nproc: int | None, max_restarts: int, *, module: bool = False) -> None:
    """`torchslurm run`'s flags and script, checked before any rank starts (and for --dry-run)."""
    ConfigError.raise_any([
        nproc_problem(nproc),
        None if max_restarts >= 0 else below_minimum(  # torch's agent divides by zero on -1, after the ranks ran
            "--max-restarts", max_restarts, 0, hint="--max-restarts 0 (the default) fails on the first error; "
            "--max-restarts 3 restarts all ranks up to 3 times."),
        module_problem(script) if module else script_problem(script),
    ])


def run_flags_after_script(script_args: Sequence[str]) -> list[str]:
    """torchslurm run's own flags among the script's arguments (the script gets them, as under torchrun:
    `run train.py --dry-run` trains), once each."""
    return [flag for flag in dict.fromkeys(arg.partition("=")[0] for arg in script_args) if flag in RUN_FLAGS]


def nproc_problem(nproc: int | None) -> ConfigError | None:
    """The one rule for --nproc (run, train, doctor, bench): unset, or at least one rank."""
    if nproc is None or nproc >= 1:
        return None
    return below_minimum("--nproc", nproc, 1, hint="--nproc 2 starts two ranks.")


def data_file_kind(script: str) -> str | None:
    """"YAML", "JSON" or "TOML" where `script` is named as such a file (a config or job spec given where
    the training script goes, which python cannot run), else None."""
    return _DATA_FILES.get(Path(script).suffix.lower())


_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "csh", "tcsh", "fish"})
_SHELL_SUFFIXES = frozenset({".sh", ".bash", ".zsh", ".ksh", ".csh", ".sbatch", ".slurm"})


def shell_script_kind(script: str, first_line: str) -> str | None:
    """How `script` shows itself a shell script (a hand-written sbatch script given where the training
    script goes): 'a .sh file' by its name, 'a shell script (#!/bin/bash)' by its #! line; else None."""
    suffix = Path(script).suffix.lower()
    if suffix in _SHELL_SUFFIXES:
        return f"a {suffix} file"
    if suffix == ".py" or not first_line.startswith("#!"):  # a .py file may start #!/bin/sh, then exec python
        return None
    words = first_line[2:].split()
    if words and Path(words[0]).name == "env":  # #!/usr/bin/env [-S] [VAR=x] bash
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    if words and Path(words[0]).name in _SHELLS:
        return f"a shell script ({first_line.strip()})"
    return None


def first_line(path: Path) -> str:
    """The file's first line (at most 200 bytes), '' when it cannot be read."""
    try:
        with path.open("rb") as file:
            return file.readline(200).decode(errors="replace")
    except OSError:
        return ""


def script_problem(script: str) -> ConfigError | None:
    """Why `python script` cannot start, or None: it must be a file (or a folder with __main__.py,
    which python runs too), and not a config file or a shell script."""
    path = Path(script)
    kind = data_file_kind(script)
    if kind is not None and not path.is_dir():
        return ConfigError(f"script {script!r} is a {kind} file, not a Python script: `python {script}` would fail.",
                           "give the training script first and this file among its arguments, e.g. "
                           f"`torchslurm run --nproc 2 train.py --config {script}`.")
    shell = None if path.is_dir() else shell_script_kind(script, first_line(path))
    if shell is not None:
        return ConfigError(f"script {script!r} is {shell}, not a Python script: `python {script}` would fail.",
                           "give the Python training script (`torchslurm run --nproc 2 train.py`); a hand-written "
                           f"sbatch script is submitted with `sbatch {script}` (check it first: "
                           f"`torchslurm lint {script}`).")
    if path.is_file() or (path.is_dir() and (path / "__main__.py").is_file()):
        return None
    if path.is_dir():
        seen = "is a directory without __main__.py"
    elif path.exists():
        seen = "is not a regular file"
    else:
        seen = "does not exist"
    return ConfigError(f"script {script!r} {seen}; expected a Python file.",
                       "give the path of the training script, e.g. `torchslurm run --nproc 2 train.py`.")


def module_problem(name: str) -> ConfigError | None:
    """Why `python -m name` cannot start, or None. Finding it imports its parent packages, as
    `python -m` itself does."""
    with contextlib.suppress(ImportError, ValueError):
        if importlib.util.find_spec(name) is not None:
            return None
    return ConfigError(f"module {name!r} cannot be imported here; expected a module that `python -m` can run.",
                       "give its dotted name as `python -m` takes it, with its package installed or under "
                       "the current directory.")
