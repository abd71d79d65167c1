"""lint rules that ask the machine lint runs on: does bash parse the script (`bash -n`, asked by the CLI),
does the log folder exist. Pure: the answers come in as `Facts` (rule.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import PurePosixPath

from torchslurm.jobs.findings import log_dir_missing
from torchslurm.lint.rule import Facts, Flag, rule

__all__: list[str] = []


@rule("log-dir", ("error", "info"),
      "`--output=~/logs/%j.out`: Slurm never expands `~` (error). A folder not found where lint runs: info (it may "
      "exist on the cluster); Slurm does not create it.")
def log_dir(x: Facts) -> Iterator[Flag]:
    """Slurm does not create the log folder. Lint usually runs where the cluster's folders are not (a laptop,
    a CI): then it is a note, not a warning. A `~` is never expanded by Slurm: always wrong."""
    for key in ("output", "error"):
        value = x.script.directives.get(key, "x")
        parent = str(PurePosixPath(value).parent)
        if value.startswith("~"):
            fixed = "$HOME" + value[1:] if value.startswith("~/") else value
            yield Flag("error", f"--{key}={value}: Slurm never expands `~` (only the shell does), so it opens a "
                       f"folder literally named `{value.split('/')[0]}` in the working directory, which does not "
                       "exist: the job fails before printing anything.",
                       f"write the full path, e.g. #SBATCH --{key}={fixed.replace('$HOME', '/home/USER')} "
                       "(#SBATCH lines expand no variables either).")
        elif parent not in (".", "") and "%" not in parent and (x.path_exists is None or not x.path_exists(parent)):
            missing = log_dir_missing(key, value, parent)  # what `torchslurm script` says too, as a note here
            yield Flag("info", missing.message, missing.hint)


@rule("bash-syntax", ("error",), "`bash -n` fails: the job waits in the queue, then dies at that line.")
def bash_syntax(x: Facts) -> Iterator[Flag]:
    if x.syntax_error is not None:
        line, message = x.syntax_error
        yield Flag("error", f"bash cannot parse the script ({message}): the job waits in the queue, then dies at "
                   "that line.", f"fix line {line}; `bash -n SCRIPT` checks it without running anything.", line)
