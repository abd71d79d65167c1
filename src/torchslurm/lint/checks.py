"""lint(text) -> findings for a hand-written sbatch script: the usual multi-node mistakes.

Pure: parse.parse() reads the script (its `#SBATCH` directives and its srun / torchrun / python
lines); the checks here return `Finding`s: what makes sbatch refuse the script (no `#!`, an
option it does not know, a value it refuses), then the multi-node mistakes of the directives and
the batch shell (counts, MASTER_ADDR/MASTER_PORT, per-rank NICs, --signal, --export, log folders).
The checks of the launch lines themselves (ranks per node against GPUs, launchers that do not
rendezvous across the step's nodes) are in launch.py. Nothing is executed.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import PurePosixPath

from torchslurm.errors import ConfigError
from torchslurm.jobs.findings import Finding, by_severity, log_dir_missing
from torchslurm.jobs.spec import parse_time
from torchslurm.lint.launch import (
    check_launches,
    check_rendezvous,
    gpus_per_node,
    leading_int,
    tasks_per_node,
)
from torchslurm.lint.launchers import check_batch_expanded, check_deepspeed_accelerate
from torchslurm.lint.options import SBATCH, long_matches
from torchslurm.lint.parse import Script, parse
from torchslurm.lint.ports import check_ports
from torchslurm.lint.shell import batch_expanded, shown
from torchslurm.lint.slips import check_shell_slips

__all__ = ["gpus_per_node", "lint", "parse", "tasks_per_node"]

_SIGNALS_DEFAULT_KILL = {"USR1", "USR2", "SIGUSR1", "SIGUSR2", "10", "12"}

_NODES_RE = re.compile(r"^(\d+)[kKmM]?(?:-(\d+)[kKmM]?)?$")  # Slurm's N or MIN-MAX (k, M: x1024)
_GPUS_RE = re.compile(r"^(?:[^:,]+:)?\d+$")  # [type:]N


def _valid_time(value: str) -> bool:
    if value.upper() in ("-1", "INFINITE", "UNLIMITED"):  # Slurm's words for no limit
        return True
    try:
        parse_time(value)
    except ConfigError:
        return False
    return True


def _valid_nodes(value: str) -> bool:
    m = _NODES_RE.match(value)
    return m is not None and int(m.group(1)) >= 1 and (m.group(2) is None or int(m.group(2)) >= int(m.group(1)))


def _positive(value: str) -> bool:
    return value.isdigit() and int(value) > 0  # sbatch: `Invalid numeric value "0" for --ntasks.`


def _gpus(value: str) -> bool:
    return _GPUS_RE.match(value) is not None


# option -> (is the value valid, what it must be, a valid example)
_RULES: dict[str, tuple[Callable[[str], bool], str, str]] = {
    "time": (_valid_time, "a Slurm time limit", "--time=1:30:00 (minutes, H:MM:SS or D-HH:MM:SS)"),
    "time-min": (_valid_time, "a Slurm time limit", "--time-min=1:00:00 (minutes, H:MM:SS or D-HH:MM:SS)"),
    "nodes": (_valid_nodes, "a node count", "--nodes=2 (at least 1), or a range: --nodes=2-4"),
    **{key: (_positive, "a whole number of at least 1", f"--{key}=4")
       for key in ("ntasks", "ntasks-per-node", "cpus-per-task")},
    **{key: (_gpus, "a GPU count", f"--{key}=4, or with a GPU type: --{key}=a100:4")
       for key in ("gpus", "gpus-per-node", "gpus-per-task")},
}


SyntaxCheck = Callable[[str], "tuple[int, str] | None"]
"""Reads a script as bash would (`bash -n`): the first syntax error as (line, bash's message), or None."""


def lint(text: str, path_exists: Callable[[str], bool] | None = None,
         syntax: SyntaxCheck | None = None) -> list[Finding]:
    """All pitfalls found in `text`, errors first. `path_exists` lets the CLI check log directories,
    `syntax` lets it ask bash itself whether the script parses (cli/lint.py: `bash -n`)."""
    script = parse(text)
    found: list[Finding] = []
    for check in (_check_shebang, _check_options, _check_values, _check_presence, _check_counts, check_launches,
                  check_rendezvous, check_deepspeed_accelerate, check_ports, _check_master, _check_nic,
                  _check_signal, _check_export, _check_batch_rank_vars, check_batch_expanded, check_shell_slips):
        found += check(script)
    found += _check_output_dir(script, path_exists)
    error = syntax(text) if syntax is not None else None
    if error is not None:
        found.append(Finding("error", "bash-syntax", f"line {error[0]}: bash cannot parse the script ({error[1]}): "
                             "the job waits in the queue, then dies at that line.",
                             f"fix line {error[0]}; `bash -n SCRIPT` checks it without running anything."))
    return by_severity(found)


def _check_shebang(s: Script) -> list[Finding]:
    """sbatch takes only scripts whose first two bytes are `#!` (sbatch/opt.c: "This does not look like a batch
    script"), so that the node knows what interpreter runs it."""
    if s.first_line.startswith("#!"):
        return []
    first = s.first_line if len(s.first_line) <= 40 else s.first_line[:40] + "..."
    found = f"`{first}`" if first.strip() else "empty"
    return [Finding("error", "no-shebang", f"line 1 is {found}, not `#!` and an interpreter: sbatch refuses the script "
                    "(\"This does not look like a batch script\").", "#!/bin/bash as the very first line.")]


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


def _check_options(s: Script) -> list[Finding]:
    """`#SBATCH` options sbatch does not know: it refuses the whole script (`unrecognized option`)."""
    out = []
    for line, key, value in s.directive_list:
        shown = f"line {line}: #SBATCH " + (f"-{key} {value}".strip() if len(key) == 1 else
                                           f"--{key}" + (f"={value}" if value else ""))
        if len(key) == 1:
            if key not in SBATCH.short_names:
                out.append(Finding("error", "unknown-option", f"{shown}: sbatch has no option -{key} and refuses the "
                                   "script (checked against sbatch 22.05's options).",
                                   "check the letter in `sbatch --help`, or write the long option "
                                   "(#SBATCH --nodes=2)."))
            continue
        matches = long_matches(key, SBATCH)
        if len(matches) > 1:
            out.append(Finding("error", "unknown-option", f"{shown}: --{key} is ambiguous, the start of "
                               f"{', '.join('--' + m for m in matches)}; sbatch refuses the script.",
                               f"spell the option out, e.g. #SBATCH --{matches[0]}{'=' + value if value else ''}."))
        elif not matches and not key.startswith(_PLUGIN_PREFIXES):
            close = difflib.get_close_matches(key.replace("_", "-"), sorted(SBATCH.long_names), n=1, cutoff=0.6)
            if close and edit_distance(key.replace("_", "-"), close[0]) <= _TYPO_EDITS:
                out.append(Finding("error", "unknown-option", f"{shown}: sbatch has no option --{key} and refuses the "
                                   "script (`sbatch: unrecognized option`; checked against sbatch 22.05's options).",
                                   f"did you mean --{close[0]}? #SBATCH --{close[0]}{'=' + value if value else ''}."))
            else:  # not a typo of a 22.05 option: a newer Slurm's, or a SPANK plugin's, which lint cannot know
                out.append(Finding("warning", "unknown-option", f"{shown}: sbatch 22.05 has no option --{key}; "
                                   "unless this cluster's newer Slurm or a SPANK plugin has it, sbatch refuses the "
                                   "script (`sbatch: unrecognized option`).",
                                   "check the spelling in `sbatch --help` (or `man sbatch`) on the login node."))
    return out


def _check_values(s: Script) -> list[Finding]:
    """Every value of an option lint reads that sbatch would refuse (each occurrence: sbatch checks each)."""
    out = []
    one_dash = {line for line, _ in s.one_dash}  # said better by check_shell_slips
    for line, key, value in s.directive_list:
        rule = _RULES.get(key)
        if line in one_dash and len(key) > 1 and value and value[0].isalpha():
            continue
        if rule is None or rule[0](value):
            continue
        _, what, example = rule
        why = "sbatch refuses the script"
        if key == "nodes" and value.startswith("-"):  # proc_args.c verify_node_count: "-1" is the range 1-1
            why = "Slurm reads the leading `-` as a MIN-MAX range without MIN, i.e. 1 node"
        out.append(Finding("error", "invalid-value", f"line {line}: #SBATCH --{key}={value} is not {what}; {why}.",
                           f"#SBATCH {example}."))
    return out


def _check_presence(s: Script) -> list[Finding]:
    """`#SBATCH` lines sbatch ignores (after the first command), or none at all."""
    out = [Finding("warning", "late-directive", f"line {line}: #SBATCH after the first command: sbatch ignores it.",
                   "move it up: sbatch reads #SBATCH lines only before the first command (comments and blank lines "
                   "may come between them).") for line in s.late_directives]
    if s.directive_list or s.late_directives:
        return out
    if not s.launches:
        return [Finding("warning", "no-directives",
                        "no #SBATCH directives and no srun, torchrun or python line found: nothing to check.",
                        "lint reads sbatch scripts: #SBATCH lines at the top (#SBATCH --nodes=2 --ntasks-per-node=4 "
                        "--gpus-per-node=4), then the training command (srun python train.py).")]
    return [Finding("info", "no-directives",
                    "no #SBATCH directives found: lint checked the script against Slurm's defaults (1 node, 1 task); "
                    "options given on the sbatch command line are not seen.",
                    "write them in the script (#SBATCH --nodes=2 --ntasks-per-node=4 ...) so it says what it needs.")]


def _check_counts(s: Script) -> list[Finding]:
    d, out = s.directives, []
    ntasks, nodes = leading_int(d.get("ntasks")), leading_int(d.get("nodes"))
    per_node = leading_int(d.get("ntasks-per-node"))
    if ntasks is not None and nodes is not None and per_node is not None and ntasks != nodes * per_node:
        out.append(Finding("error", "ntasks-mismatch",
                           f"--ntasks={ntasks} but --nodes={nodes} x --ntasks-per-node={per_node} = "
                           f"{nodes * per_node}.",
                           f"drop --ntasks, or set --ntasks={nodes * per_node}."))
    return out



def _check_master(s: Script) -> list[Finding]:
    out = []
    exports = {**s.task_exports, **s.exports}
    if "NCCL_IB_DISABLE" in exports and exports["NCCL_IB_DISABLE"][1] == "1":
        out.append(Finding("info", "nccl-ib-disabled",
                           f"line {exports['NCCL_IB_DISABLE'][0]}: NCCL_IB_DISABLE=1 forces NCCL onto TCP sockets "
                           "even where InfiniBand exists (much slower all-reduce).",
                           "remove it unless IB is broken on this cluster; check with NCCL_DEBUG=INFO."))
    if "MASTER_ADDR" in exports:
        line, value = exports["MASTER_ADDR"]
        if "$" not in value and "`" not in value:  # $(hostname) in the batch shell: the first node, at run time
            out.append(Finding("error", "hard-coded-master-addr",
                               f"line {line}: MASTER_ADDR={value} is fixed; the job's first node differs per job.",
                               "remove it: torchslurm.init() uses the first host of SLURM_JOB_NODELIST (or "
                               "head=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1))."))
    return out


def _check_nic(s: Script) -> list[Finding]:
    return [Finding("warning", "per-rank-nic",
                    f"line {line}: a `case` on the rank picks *_SOCKET_IFNAME per node by hand; it breaks when "
                    "the job lands on other nodes or ranks move.",
                    "delete the case block: torchslurm picks, on each node, the interface that reaches the master.")
            for line in s.rank_cases]


def _check_signal(s: Script) -> list[Finding]:
    sig = s.directives.get("signal")
    if sig is None:
        return []
    out = []
    name = sig.split("@")[0]
    trapped = any(name.removeprefix("B:").removeprefix("SIG") in t for t in s.traps)
    if name.startswith("B:") and not trapped and s.launches:
        out.append(Finding("error", "signal-unreachable",
                           f"--signal={sig}: `B:` sends the signal only to the batch shell, which has no trap; "
                           "the Python ranks never see it.",
                           f"--signal={name.removeprefix('B:')}@{sig.partition('@')[2]} (without B:) reaches the "
                           "tasks of every job step."))
    for ln in s.launches:
        forwarded = (ln.signals_to_handle is not None and name.removeprefix("B:") in ln.signals_to_handle) \
            or name.removeprefix("SIG") in ln.ignored
        if ln.launcher == "torchrun" and not name.startswith("B:") and not forwarded \
                and name.removeprefix("SIG") in _SIGNALS_DEFAULT_KILL:
            out.append(Finding("warning", "signal-kills-torchrun",
                               f"line {ln.line}: --signal={sig} also reaches the torchrun agent, which does not "
                               "handle it and dies (the default action), taking its workers down.",
                               f"run the agent as bash -c 'trap \"\" {name.removeprefix('SIG')}; exec \"$@\"' _ "
                               "torchrun ... (workers still get the signal from Slurm)."))
    if "requeue" not in s.directives:
        out.append(Finding("warning", "signal-without-requeue",
                           f"--signal={sig} without --requeue: a job that checkpoints on the signal cannot be "
                           "put back in the queue to resume.", "#SBATCH --requeue (and --open-mode=append)."))
    return out


def _check_export(s: Script) -> list[Finding]:
    if s.directives.get("export", "").upper() != "NONE":
        return []
    return [Finding("error", "export-none-bare-python",
                    f"line {ln.line}: --export=NONE leaves srun's tasks without PATH, so `{ln.python}` is not "
                    "found (execve(): No such file or directory).",
                    f"use an absolute path (e.g. /path/to/venv/bin/{ln.python}) or srun --export=ALL.")
            for ln in s.launches if "/" not in ln.python and ln.srun_opts.get("export", "").upper() != "ALL"]


# what torch's env:// rendezvous and most training scripts read from the environment as their own rank
_RANK_ENV = {"RANK", "LOCAL_RANK", "GROUP_RANK"}


def _check_batch_rank_vars(s: Script) -> list[Finding]:
    """`export RANK=$SLURM_PROCID` before srun: every task inherits the batch shell's 0. A variable that is
    not exported, or that no program reads as its rank, does no harm unless a launch line uses it
    (check_batch_expanded sees those)."""
    out: list[Finding] = []
    if not any(ln.under_srun for ln in s.launches):
        return out
    for key, (line, value) in s.exports.items():
        name = batch_expanded(value)
        if name and key in _RANK_ENV and key in s.exported:
            out.append(Finding("error", "batch-shell-rank",
                               f"line {line}: {key}={shown(value)} is evaluated once in the batch shell, where {name} "
                               "is 0; every rank gets the same value.",
                               f"remove it: each task sets {key} from its own SLURM_* variables "
                               "(torchslurm.init() reads them)."))
    return out


def _check_output_dir(s: Script, path_exists: Callable[[str], bool] | None) -> list[Finding]:
    """Slurm does not create the log folder. Lint usually runs where the cluster's folders are not (a laptop,
    a CI): then it is a note, not a warning. A `~` is never expanded by Slurm: always wrong."""
    out = []
    for key in ("output", "error"):
        value = s.directives.get(key, "x")
        parent = str(PurePosixPath(value).parent)
        if value.startswith("~"):
            fixed = "$HOME" + value[1:] if value.startswith("~/") else value
            out.append(Finding("error", "log-dir", f"--{key}={value}: Slurm never expands `~` (only the shell does), "
                               f"so it opens a folder literally named `{value.split('/')[0]}` in the working "
                               "directory, which does not exist: the job fails before printing anything.",
                               f"write the full path, e.g. #SBATCH --{key}={fixed.replace('$HOME', '/home/USER')} "
                               "(#SBATCH lines expand no variables either)."))
        elif parent not in (".", "") and "%" not in parent and (path_exists is None or not path_exists(parent)):
            out.append(replace(log_dir_missing(key, value, parent), severity="info"))
    return out
