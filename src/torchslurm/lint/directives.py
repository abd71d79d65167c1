"""lint rules of the `#SBATCH` directives: what makes sbatch refuse the script (no `#!`, an option it does
not know, a value it refuses), directives it never reads, and counts that contradict each other.

Pure, nothing executed. Each rule is declared once, with `@rule` (rule.py); registry.py collects them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator

from torchslurm.errors import ConfigError
from torchslurm.jobs.slurmvalues import parse_time
from torchslurm.lint.allocation import leading_int
from torchslurm.lint.options import SBATCH, long_matches
from torchslurm.lint.parse import Script
from torchslurm.lint.rule import Facts, Flag, rule
from torchslurm.runtime.variables import is_digits

__all__ = ["edit_distance"]

_NODES_RE = re.compile(r"([0-9]{1,9})[kKmM]?(?:-([0-9]{1,9})[kKmM]?)?")  # Slurm's N or MIN-MAX (k, M: x1024)
_GPUS_RE = re.compile(r"(?:[^:,]+:)?[0-9]+")  # [type:]N


def _valid_time(value: str) -> bool:
    if value.upper() in ("-1", "INFINITE", "UNLIMITED"):  # Slurm's words for no limit
        return True
    try:
        parse_time(value)
    except ConfigError:
        return False
    return True


def _valid_nodes(value: str) -> bool:
    m = _NODES_RE.fullmatch(value)
    return m is not None and int(m.group(1)) >= 1 and (m.group(2) is None or int(m.group(2)) >= int(m.group(1)))


def _positive(value: str) -> bool:
    return is_digits(value) and int(value) > 0  # sbatch: `Invalid numeric value "0" for --ntasks.`


def _gpus(value: str) -> bool:
    return _GPUS_RE.fullmatch(value) is not None


# option -> (is the value valid, what it must be, a valid example)
_VALUES: dict[str, tuple[Callable[[str], bool], str, str]] = {
    "time": (_valid_time, "a Slurm time limit", "--time=1:30:00 (minutes, H:MM:SS or D-HH:MM:SS)"),
    "time-min": (_valid_time, "a Slurm time limit", "--time-min=1:00:00 (minutes, H:MM:SS or D-HH:MM:SS)"),
    "nodes": (_valid_nodes, "a node count", "--nodes=2 (at least 1), or a range: --nodes=2-4"),
    **{key: (_positive, "a whole number of at least 1", f"--{key}=4")
       for key in ("ntasks", "ntasks-per-node", "cpus-per-task")},
    **{key: (_gpus, "a GPU count", f"--{key}=4, or with a GPU type: --{key}=a100:4")
       for key in ("gpus", "gpus-per-node", "gpus-per-task")},
}


@rule("no-shebang", ("error",), "line 1 is not `#!...`: sbatch refuses the script.")
def no_shebang(x: Facts) -> Iterator[Flag]:
    """sbatch takes only scripts whose first two bytes are `#!` (sbatch/opt.c: "This does not look like a batch
    script"), so that the node knows what interpreter runs it."""
    first_line = x.script.text.split("\n", 1)[0]
    if first_line.startswith("#!"):
        return
    first = first_line if len(first_line) <= 40 else first_line[:40] + "..."
    found = f"`{first}`" if first.strip() else "empty"
    yield Flag("error", f"line 1 is {found}, not `#!` and an interpreter: sbatch refuses the script "
               "(\"This does not look like a batch script\").", "#!/bin/bash as the very first line.")


@rule("dos-line-breaks", ("error",), "DOS line breaks (`\\r\\n`: saved on Windows): sbatch refuses the script.")
def dos_line_breaks(x: Facts) -> Iterator[Flag]:
    """sbatch refuses a script with `\\r\\n` anywhere in it ("Batch script contains DOS line breaks (\\r\\n) instead
    of expected UNIX line breaks (\\n)"); bash would read each `\\r` as part of a word (`--nodes=2\\r`)."""
    at = x.script.text.find("\r\n")
    if at >= 0:
        line = x.script.text.count("\n", 0, at) + 1
        yield Flag("error", "this line ends in a DOS line break (\\r\\n): sbatch refuses a script with any (\"Batch "
                   "script contains DOS line breaks\").", "convert them to UNIX line breaks: dos2unix SCRIPT, or "
                   "sed -i 's/\\r$//' SCRIPT.", line)


# options that SPANK plugins add to sbatch on GPU clusters (pyxis: --container-image, --container-mounts, ...)
_PLUGIN_PREFIXES = ("container-", "no-container-")


_TYPO_EDITS = 2
"""An unknown option this close to a known one (`--nodse`, `--ntask-per-node`) is a typo; a farther one
may be a newer Slurm's (`--tres-bind`, 24.05) and is only a warning."""


def edit_distance(a: str, b: str) -> int:
    """Edits (insert, delete, substitute, swap two neighbours) that turn `a` into `b`."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i]
        for j, cb in enumerate(b, 1):
            cost = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cost = min(cost, previous2[j - 2] + 1)
            row.append(cost)
        previous2, previous = previous, row
    return previous[-1]


@rule("unknown-option", ("error", "warning"),
      "an `#SBATCH` option sbatch 22.05 does not know (error when it is a typo of a known one, warning otherwise: "
      "a newer Slurm or a plugin may have it).")
def unknown_option(x: Facts) -> Iterator[Flag]:
    """`#SBATCH` options sbatch does not know: it refuses the whole script (`unrecognized option`)."""
    for line, key, value in x.script.directive_list:
        shown = "#SBATCH " + (f"-{key} {value}".strip() if len(key) == 1 else
                              f"--{key}" + (f"={value}" if value else ""))
        if len(key) == 1:
            if key not in SBATCH.short_names:
                yield Flag("error", f"{shown}: sbatch has no option -{key} and refuses the script (checked against "
                           "sbatch 22.05's options).",
                           "check the letter in `sbatch --help`, or write the long option (#SBATCH --nodes=2).", line)
            continue
        matches = long_matches(key, SBATCH)
        if len(matches) > 1:
            yield Flag("error", f"{shown}: --{key} is ambiguous, the start of "
                       f"{', '.join('--' + m for m in matches)}; sbatch refuses the script.",
                       f"spell the option out, e.g. #SBATCH --{matches[0]}{'=' + value if value else ''}.", line)
        elif not matches and not key.startswith(_PLUGIN_PREFIXES):
            close = difflib.get_close_matches(key.replace("_", "-"), sorted(SBATCH.long_names), n=1, cutoff=0.6)
            if close and edit_distance(key.replace("_", "-"), close[0]) <= _TYPO_EDITS:
                yield Flag("error", f"{shown}: sbatch has no option --{key} and refuses the script (`sbatch: "
                           "unrecognized option`; checked against sbatch 22.05's options).",
                           f"did you mean --{close[0]}? #SBATCH --{close[0]}{'=' + value if value else ''}.", line)
            else:  # not a typo of a 22.05 option: a newer Slurm's, or a SPANK plugin's, which lint cannot know
                yield Flag("warning", f"{shown}: sbatch 22.05 has no option --{key}; unless this cluster's newer "
                           "Slurm or a SPANK plugin has it, sbatch refuses the script (`sbatch: unrecognized "
                           "option`).", "check the spelling in `sbatch --help` (or `man sbatch`) on the login node.",
                           line)


@rule("invalid-value", ("error",), "a value sbatch refuses (`--nodes=0`, `--time=abc`).")
def invalid_value(x: Facts) -> Iterator[Flag]:
    """Every value of an option lint reads that sbatch would refuse (each occurrence: sbatch checks each)."""
    for line, key, value in x.script.directive_list:
        check = _VALUES.get(key)
        if check is None or check[0](value):
            continue
        _, what, example = check
        why = "sbatch refuses the script"
        if key == "nodes" and value.startswith("-"):  # proc_args.c verify_node_count: "-1" is the range 1-1
            why = "Slurm reads the leading `-` as a MIN-MAX range without MIN, i.e. 1 node"
        yield Flag("error", f"#SBATCH --{key}={value} is not {what}; {why}.", f"#SBATCH {example}.", line, key)


def _late_directives(s: Script) -> list[int]:
    """Lines of `#SBATCH` after the first command, which sbatch ignores."""
    first = s.first_command
    return [line for line, text in s.bodies[0] if first is not None and line > first and text.startswith("#SBATCH")]


@rule("late-directive", ("warning",), "`#SBATCH` after the first command: ignored.")
def late_directive(x: Facts) -> Iterator[Flag]:
    for line in _late_directives(x.script):
        yield Flag("warning", "#SBATCH after the first command: sbatch ignores it.",
                   "move it up: sbatch reads #SBATCH lines only before the first command (comments and blank "
                   "lines may come between them).", line)


@rule("no-directives", ("warning", "info"),
      "no `#SBATCH` directive: nothing to check without a launch line either (warning); else advice: Slurm's defaults "
      "are assumed (info).")
def no_directives(x: Facts) -> Iterator[Flag]:
    s = x.script
    if s.directive_list or _late_directives(s):
        return
    if not s.launches:
        yield Flag("warning", "no #SBATCH directives and no srun, torchrun or python line found: nothing to check.",
                   "lint reads sbatch scripts: #SBATCH lines at the top (#SBATCH --nodes=2 --ntasks-per-node=4 "
                   "--gpus-per-node=4), then the training command (srun python train.py).")
        return
    yield Flag("info", "no #SBATCH directives found: lint checked the script against Slurm's defaults (1 node, "
               "1 task); options given on the sbatch command line are not seen.",
               "write them in the script (#SBATCH --nodes=2 --ntasks-per-node=4 ...) so it says what it needs.")


@rule("ntasks-mismatch", ("error",), "`--ntasks` differs from `--nodes` × `--ntasks-per-node`.")
def ntasks_mismatch(x: Facts) -> Iterator[Flag]:
    d = x.script.directives
    ntasks, nodes = leading_int(d.get("ntasks")), leading_int(d.get("nodes"))
    per_node = leading_int(d.get("ntasks-per-node"))
    if ntasks is not None and nodes is not None and per_node is not None and ntasks != nodes * per_node:
        yield Flag("error", f"--ntasks={ntasks} but --nodes={nodes} x --ntasks-per-node={per_node} = "
                   f"{nodes * per_node}.", f"drop --ntasks, or set --ntasks={nodes * per_node}.")
