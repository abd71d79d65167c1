"""The rules of a script's `#SBATCH` directives and its batch shell.

What makes sbatch refuse the script (no `#!`, an option it does not know, a value it refuses, bash
cannot parse it), then the multi-node mistakes of the directives and the batch shell (counts,
MASTER_ADDR, per-rank NICs, --signal, --export, log folders). Pure, nothing executed.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import PurePosixPath

from torchslurm.errors import ConfigError
from torchslurm.jobs.findings import Finding, log_dir_missing
from torchslurm.jobs.spec import parse_time
from torchslurm.lint.allocation import leading_int
from torchslurm.lint.options import SBATCH, long_matches
from torchslurm.lint.registry import Context, rule

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


@rule("no-shebang", "error", summary="line 1 is not `#!...`: sbatch refuses the script.")
def no_shebang(c: Context) -> list[Finding]:
    s = c.script
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


@rule("unknown-option", "error", "warning", summary="an `#SBATCH` option sbatch 22.05 does not know.")
def unknown_option(c: Context) -> list[Finding]:
    s = c.script
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


@rule("invalid-value", "error", summary="a value sbatch refuses (`--nodes=0`, `--time=abc`).",
      yield_to=("one-dash-option",))
def invalid_value(c: Context) -> list[Finding]:
    s = c.script
    """Every value of an option lint reads that sbatch would refuse (each occurrence: sbatch checks each)."""
    out = []
    for line, key, value in s.directive_list:
        rule = _RULES.get(key)
        if rule is None or rule[0](value):
            continue
        _, what, example = rule
        why = "sbatch refuses the script"
        if key == "nodes" and value.startswith("-"):  # proc_args.c verify_node_count: "-1" is the range 1-1
            why = "Slurm reads the leading `-` as a MIN-MAX range without MIN, i.e. 1 node"
        out.append(Finding("error", "invalid-value", f"line {line}: #SBATCH --{key}={value} is not {what}; {why}.",
                           f"#SBATCH {example}."))
    return out


@rule("late-directive", "warning", summary="`#SBATCH` after the first command: ignored.")
def late_directive(c: Context) -> list[Finding]:
    return [Finding("warning", "late-directive", f"line {line}: #SBATCH after the first command: sbatch ignores it.",
                    "move it up: sbatch reads #SBATCH lines only before the first command (comments and blank lines "
                    "may come between them).") for line in c.script.late_directives]


@rule("no-directives", "warning", "info", summary="no `#SBATCH` directives (info), and nothing to check (warning).")
def no_directives(c: Context) -> list[Finding]:
    s = c.script
    if s.directive_list or s.late_directives:
        return []
    if not s.launches:
        return [Finding("warning", "no-directives",
                        "no #SBATCH directives and no srun, torchrun or python line found: nothing to check.",
                        "lint reads sbatch scripts: #SBATCH lines at the top (#SBATCH --nodes=2 --ntasks-per-node=4 "
                        "--gpus-per-node=4), then the training command (srun python train.py).")]
    return [Finding("info", "no-directives",
                    "no #SBATCH directives found: lint checked the script against Slurm's defaults (1 node, 1 task); "
                    "options given on the sbatch command line are not seen.",
                    "write them in the script (#SBATCH --nodes=2 --ntasks-per-node=4 ...) so it says what it needs.")]


@rule("ntasks-mismatch", "error", summary="`--ntasks` differs from `--nodes` x `--ntasks-per-node`.")
def ntasks_mismatch(c: Context) -> list[Finding]:
    s = c.script
    d, out = s.directives, []
    ntasks, nodes = leading_int(d.get("ntasks")), leading_int(d.get("nodes"))
    per_node = leading_int(d.get("ntasks-per-node"))
    if ntasks is not None and nodes is not None and per_node is not None and ntasks != nodes * per_node:
        out.append(Finding("error", "ntasks-mismatch",
                           f"--ntasks={ntasks} but --nodes={nodes} x --ntasks-per-node={per_node} = "
                           f"{nodes * per_node}.",
                           f"drop --ntasks, or set --ntasks={nodes * per_node}."))
    return out



def _exports(c: Context) -> dict[str, tuple[int, str]]:
    """Variables the batch shell or the tasks export: name -> (line, value)."""
    return {**c.script.task_exports, **c.script.exports}


@rule("nccl-ib-disabled", "info", summary="`NCCL_IB_DISABLE=1` forces NCCL onto TCP sockets.")
def nccl_ib_disabled(c: Context) -> list[Finding]:
    exports = _exports(c)
    if "NCCL_IB_DISABLE" not in exports or exports["NCCL_IB_DISABLE"][1] != "1":
        return []
    return [Finding("info", "nccl-ib-disabled",
                    f"line {exports['NCCL_IB_DISABLE'][0]}: NCCL_IB_DISABLE=1 forces NCCL onto TCP sockets "
                    "even where InfiniBand exists (much slower all-reduce).",
                    "remove it unless IB is broken on this cluster; check with NCCL_DEBUG=INFO.")]


@rule("hard-coded-master-addr", "error", summary="`MASTER_ADDR=node01`: the first node differs per job.")
def hard_coded_master_addr(c: Context) -> list[Finding]:
    line, value = _exports(c).get("MASTER_ADDR", (0, "$"))
    if "$" in value or "`" in value:  # $(hostname) in the batch shell: the first node, at run time
        return []
    return [Finding("error", "hard-coded-master-addr",
                    f"line {line}: MASTER_ADDR={value} is fixed; the job's first node differs per job.",
                    "remove it: torchslurm.init() uses the first host of SLURM_JOB_NODELIST (or "
                    "head=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)).")]


@rule("per-rank-nic", "warning", summary="a `case` on the rank picking `*_SOCKET_IFNAME`.")
def per_rank_nic(c: Context) -> list[Finding]:
    s = c.script
    return [Finding("warning", "per-rank-nic",
                    f"line {line}: a `case` on the rank picks *_SOCKET_IFNAME per node by hand; it breaks when "
                    "the job lands on other nodes or ranks move.",
                    "delete the case block: torchslurm picks, on each node, the interface that reaches the master.")
            for line in s.rank_cases]


def _signal(c: Context) -> tuple[str, str] | None:
    """`--signal` as given, and the signal's name (with `B:` if given), or None without one."""
    sig = c.script.directives.get("signal")
    return None if sig is None else (sig, sig.split("@")[0])


@rule("signal-unreachable", "error", summary="`--signal=B:...` reaches only the batch shell, which has no trap.")
def signal_unreachable(c: Context) -> list[Finding]:
    given = _signal(c)
    if given is None:
        return []
    sig, name = given
    trapped = any(name.removeprefix("B:").removeprefix("SIG") in t for t in c.script.traps)
    if not name.startswith("B:") or trapped or not c.script.launches:
        return []
    return [Finding("error", "signal-unreachable",
                    f"--signal={sig}: `B:` sends the signal only to the batch shell, which has no trap; "
                    "the Python ranks never see it.",
                    f"--signal={name.removeprefix('B:')}@{sig.partition('@')[2]} (without B:) reaches the "
                    "tasks of every job step.")]


@rule("signal-kills-torchrun", "warning", summary="`--signal` also reaches the torchrun agent, which dies of it.")
def signal_kills_torchrun(c: Context) -> Iterator[Finding]:
    given = _signal(c)
    if given is None:
        return
    sig, name = given
    for ln in c.script.launches:
        forwarded = (ln.signals_to_handle is not None and name.removeprefix("B:") in ln.signals_to_handle) \
            or name.removeprefix("SIG") in ln.ignored
        if ln.launcher == "torchrun" and not name.startswith("B:") and not forwarded \
                and name.removeprefix("SIG") in _SIGNALS_DEFAULT_KILL:
            yield Finding("warning", "signal-kills-torchrun",
                          f"line {ln.line}: --signal={sig} also reaches the torchrun agent, which does not "
                          "handle it and dies (the default action), taking its workers down.",
                          f"run the agent as bash -c 'trap \"\" {name.removeprefix('SIG')}; exec \"$@\"' _ "
                          "torchrun ... (workers still get the signal from Slurm).")


@rule("signal-without-requeue", "warning", summary="`--signal` without `--requeue`: the job cannot come back.")
def signal_without_requeue(c: Context) -> list[Finding]:
    given = _signal(c)
    if given is None or "requeue" in c.script.directives:
        return []
    return [Finding("warning", "signal-without-requeue",
                    f"--signal={given[0]} without --requeue: a job that checkpoints on the signal cannot be "
                    "put back in the queue to resume.", "#SBATCH --requeue (and --open-mode=append).")]


@rule("export-none-bare-python", "error", summary="`--export=NONE` and a bare `python`: not found.")
def export_none_bare_python(c: Context) -> list[Finding]:
    s = c.script
    if s.directives.get("export", "").upper() != "NONE":
        return []
    return [Finding("error", "export-none-bare-python",
                    f"line {ln.line}: --export=NONE leaves srun's tasks without PATH, so `{ln.python}` is not "
                    "found (execve(): No such file or directory).",
                    f"use an absolute path (e.g. /path/to/venv/bin/{ln.python}) or srun --export=ALL.")
            for ln in s.launches if "/" not in ln.python and ln.srun_opts.get("export", "").upper() != "ALL"]


@rule("log-dir", "error", "info", summary="a log folder Slurm cannot open (`~`), or one not found where lint runs.")
def log_dir(c: Context) -> list[Finding]:
    s, path_exists = c.script, c.path_exists
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


@rule("bash-syntax", "error", summary="`bash -n` fails: the job waits in the queue, then dies at that line.")
def bash_syntax(c: Context) -> list[Finding]:
    if c.syntax_error is None:
        return []
    line, message = c.syntax_error
    return [Finding("error", "bash-syntax", f"line {line}: bash cannot parse the script ({message}): the job waits "
                    "in the queue, then dies at that line.",
                    f"fix line {line}; `bash -n SCRIPT` checks it without running anything.")]
