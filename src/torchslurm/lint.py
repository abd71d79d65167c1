"""lint(text) -> findings for a hand-written sbatch script: the pitfalls of the seeds' scripts.

Pure: reads the script text (its `#SBATCH` directives with sbatch's own tokenizer, and its
srun / torchrun / python lines with shlex) and returns `Finding`s. Nothing is executed.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from torchslurm.findings import Finding, Severity
from torchslurm.sbatch import sbatch_split

# short sbatch options that the seeds (and most scripts) use, mapped to their long names
_SHORT = {"-N": "nodes", "-n": "ntasks", "-c": "cpus-per-task", "-t": "time", "-J": "job-name",
          "-o": "output", "-e": "error", "-p": "partition", "-A": "account", "-G": "gpus", "-w": "nodelist",
          "-x": "exclude", "-a": "array", "-C": "constraint", "-q": "qos"}
_FLAGS = {"requeue", "no-requeue", "exclusive", "hold", "parsable"}
_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")
_LAUNCH_MODULES = {"torch.distributed.run": "torchrun", "torch.distributed.launch": "torch.distributed.launch"}
_RANK_VARS_RE = re.compile(r"\$\{?(RANK|SLURM_PROCID|SLURM_NODEID|SLURM_LOCALID|LOCAL_RANK|NODE_RANK)\b")
_PER_TASK_VARS_RE = re.compile(r"\$\(*\{?(SLURM_PROCID|SLURM_LOCALID|SLURM_NODEID)\b")
_SIGNALS_DEFAULT_KILL = {"USR1", "USR2", "SIGUSR1", "SIGUSR2", "10", "12"}


@dataclass
class Launch:
    """One line that starts training: under srun or not, through a launcher or plain python."""

    line: int
    under_srun: bool
    srun_opts: dict[str, str]
    launcher: str | None  # "torchrun", "torch.distributed.launch" or None (plain python)
    nproc_per_node: int | None
    python: str
    rdzv_endpoint: str | None = None
    signals_to_handle: str | None = None
    ignored: list[str] = field(default_factory=list)
    """Signals the launcher ignores (`trap "" SIG` before `exec`)."""


@dataclass
class Script:
    """What lint needs to know about a script."""

    directives: dict[str, str] = field(default_factory=dict)
    exports: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Variables set in the batch shell: (line, value)."""
    task_exports: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Variables set inside each task (`srun bash -c '...'`)."""
    launches: list[Launch] = field(default_factory=list)
    rank_cases: list[int] = field(default_factory=list)
    traps: list[str] = field(default_factory=list)


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with backslash continuations joined, numbered by their first physical line."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    physical = text.split("\n")  # bash ends lines at \n only (str.splitlines knows 8 more)
    if physical and physical[-1] == "":
        physical.pop()
    for number, raw in enumerate(physical, start=1):
        if not pending:
            start = number
        if raw.endswith("\\") and not raw.lstrip().startswith("#"):
            pending += raw[:-1] + " "
            continue
        if not raw.lstrip().startswith("#") and _open_quote(pending + raw):
            pending += raw + "\n"  # a quoted string spanning lines (`srun bash -c '...'`)
            continue
        out.append((start, pending + raw))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def _open_quote(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return True
    return False


def parse_directive_args(args: list[str], into: dict[str, str]) -> None:
    """`--opt=v`, `--opt v`, `-N 2`, `-N2` and bare flags, into long-name keys."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if not eq and key not in _FLAGS and i + 1 < len(args) and not args[i + 1].startswith("-"):
                value, i = args[i + 1], i + 1
            into[key] = value
        elif arg[:2] in _SHORT:
            value = arg[2:]
            if not value and i + 1 < len(args):
                value, i = args[i + 1], i + 1
            into[_SHORT[arg[:2]]] = value.lstrip("=")
        i += 1


def parse(text: str) -> Script:
    script = Script()
    _parse_body(text, script, first_line=1, under_srun=False)
    return script


def _parse_body(text: str, script: Script, first_line: int, under_srun: bool) -> None:
    in_header, in_case = first_line == 1, False
    for number, line in logical_lines(text):
        number += first_line - 1
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            if in_header:  # sbatch stops reading directives at the first command
                parse_directive_args(sbatch_split(stripped[len("#SBATCH"):]), script.directives)
            continue
        if not stripped or stripped.startswith("#"):
            continue
        in_header = False
        if stripped.startswith("case ") and _RANK_VARS_RE.search(stripped):
            in_case = True
        if in_case and "SOCKET_IFNAME" in stripped:
            script.rank_cases.append(number)
            in_case = False
        if stripped.startswith("esac"):
            in_case = False
        _parse_command(number, stripped, script, under_srun)


def _tokens(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return line.split()


def _parse_command(number: int, line: str, script: Script, under_srun: bool) -> None:
    # a multi-line quoted string (`srun bash -c '...'`) is split into words, not on its `;`
    parts = [line] if "\n" in line else re.split(r"\s*(?:&&|\|\||;)\s*", line)
    for part in parts:
        words = _tokens(part)
        if words and words[0] == "trap":
            script.traps.append(part)
        if words and words[0] == "export":
            words = words[1:]
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            key, _, value = words[0].partition("=")
            (script.task_exports if under_srun else script.exports)[key] = (number, value)
            words = words[1:]
        launch = _parse_launch(number, words, script, under_srun)
        if launch is not None:
            script.launches.append(launch)


def _parse_launch(number: int, words: list[str], script: Script, under_srun: bool) -> Launch | None:
    srun_opts: dict[str, str] = {}
    ignored: list[str] = []
    if words and words[0] == "exec":
        words = words[1:]
    if words and PurePosixPath(words[0]).name == "srun":
        under_srun, words = True, words[1:]
        opts: list[str] = []
        while words and words[0].startswith("-"):
            opts.append(words.pop(0))
            if opts[-1][:2] in _SHORT and len(opts[-1]) == 2 and words:
                opts.append(words.pop(0))
        parse_directive_args(opts, srun_opts)
        for opt in opts:  # -K / -K0 / -K1: an optional value attached, not in _SHORT
            if opt.startswith("-K"):
                srun_opts["kill-on-bad-exit"] = opt[2:]
    if len(words) >= 3 and PurePosixPath(words[0]).name in ("bash", "sh") and words[1] == "-c":
        code = words[2]
        if '"$@"' not in code:  # `srun bash -c '<script>'`: lint the inner script as run by each task
            _parse_body(code, script, first_line=number, under_srun=under_srun)
            return None
        # `bash -c 'trap "" SIG; exec "$@"' NAME cmd...`: the command is the rest, signals ignored
        ignored = re.findall(r'trap\s+(?:""|\'\')\s+([A-Z0-9 ]+)', code)
        words = words[4:]
    if not words:
        return None
    name = PurePosixPath(words[0]).name
    launcher: str | None = None
    rest = words[1:]
    if name == "torchrun":
        launcher = "torchrun"
    elif _PYTHON_RE.match(name):
        if len(rest) >= 2 and rest[0] == "-m" and rest[1] in _LAUNCH_MODULES:
            launcher, rest = _LAUNCH_MODULES[rest[1]], rest[2:]
        elif not rest or (rest[0].startswith("-") and rest[0] != "-u"):
            return None  # `python -c ...`, `python --version`: not training
    else:
        return None
    opts_map: dict[str, str] = {}
    parse_directive_args([_dashes(w) for w in rest], opts_map)
    nproc = opts_map.get("nproc-per-node")
    return Launch(number, under_srun, srun_opts, launcher, int(nproc) if nproc and nproc.isdigit() else None,
                  python=words[0], rdzv_endpoint=opts_map.get("rdzv-endpoint"),
                  signals_to_handle=opts_map.get("signals-to-handle"), ignored=" ".join(ignored).split())


def _dashes(word: str) -> str:
    """`--nproc_per_node=8` -> `--nproc-per-node=8` (launchers accept both spellings)."""
    if not word.startswith("--"):
        return word
    key, eq, value = word.partition("=")
    return key.replace("_", "-") + eq + value


# -- the checks ------------------------------------------------------------------------------


def _int(value: str | None) -> int | None:
    m = re.match(r"^\d+", value or "")
    return int(m.group(0)) if m else None


def gpus_per_node(d: dict[str, str]) -> int | None:
    """GPUs per node asked for by --gpus-per-node, --gres=gpu[:type]:N, --gpus-per-task or --gpus."""
    if "gpus-per-node" in d:
        return _int(d["gpus-per-node"].split(":")[-1])
    for item in d.get("gres", "").split(","):
        parts = item.split(":")
        if parts[0] == "gpu":
            return _int(parts[-1]) if len(parts) > 1 else 1
    per_task, tasks = _int(d.get("gpus-per-task")), tasks_per_node(d)
    if per_task is not None and tasks is not None:
        return per_task * tasks
    total, nodes = _int(d.get("gpus", "").split(":")[-1]), _int(d.get("nodes")) or 1
    return None if total is None else total // nodes


def tasks_per_node(d: dict[str, str]) -> int | None:
    if "ntasks-per-node" in d:
        return _int(d["ntasks-per-node"])
    ntasks, nodes = _int(d.get("ntasks")), _int(d.get("nodes"))
    if ntasks is not None:
        return ntasks // (nodes or ntasks)
    return None


def lint(text: str, path_exists: Callable[[str], bool] | None = None) -> list[Finding]:
    """All pitfalls found in `text`, errors first. `path_exists` lets the CLI check log directories."""
    script = parse(text)
    found: list[Finding] = []
    for check in (_check_counts, _check_launches, _check_master, _check_nic, _check_signal,
                  _check_export, _check_batch_rank_vars):
        found += check(script)
    found += _check_output_dir(script, path_exists)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(found, key=lambda f: order[f.severity])


def _f(severity: Severity, code: str, message: str, hint: str) -> Finding:
    return Finding(severity, code, message, hint)


def _check_counts(s: Script) -> list[Finding]:
    d, out = s.directives, []
    ntasks, nodes, per_node = _int(d.get("ntasks")), _int(d.get("nodes")), _int(d.get("ntasks-per-node"))
    if ntasks is not None and nodes is not None and per_node is not None and ntasks != nodes * per_node:
        out.append(_f("error", "ntasks-mismatch",
                      f"--ntasks={ntasks} but --nodes={nodes} x --ntasks-per-node={per_node} = {nodes * per_node}.",
                      f"drop --ntasks, or set --ntasks={nodes * per_node}."))
    return out


def _check_launches(s: Script) -> list[Finding]:
    d, out = s.directives, []
    gpus, tasks = gpus_per_node(d), tasks_per_node(d) or 1
    nodes, total = _int(d.get("nodes")) or 1, (_int(d.get("ntasks")) or (tasks * (_int(d.get("nodes")) or 1)))
    for ln in s.launches:
        where = f"line {ln.line}"
        if ln.launcher == "torch.distributed.launch":
            out.append(_f("warning", "deprecated-launch",
                          f"{where}: python -m torch.distributed.launch is deprecated (it passes --local-rank "
                          "as an argument and is removed in recent torch).",
                          "use torchrun (python -m torch.distributed.run), or srun with one task per GPU."))
        if ln.launcher is None and not ln.under_srun and (total > 1 or nodes > 1):
            out.append(_f("error", "python-without-srun",
                          f"{where}: `{ln.python} ...` runs once, in the batch shell on the first node, but the "
                          f"allocation has {total} task(s) on {nodes} node(s).",
                          f"srun {ln.python} ... (one rank per task), or `torchslurm run`."))
        if ln.launcher is not None and not ln.under_srun and nodes > 1:
            out.append(_f("error", "launcher-without-srun",
                          f"{where}: {ln.launcher} runs only on the first of {nodes} nodes without srun.",
                          "srun --ntasks-per-node=1 torchrun ... (one launcher per node)."))
        if ln.launcher is not None and ln.under_srun and tasks > 1 and _int(ln.srun_opts.get("ntasks")) is None:
            out.append(_f("error", "launcher-per-task",
                          f"{where}: srun starts {ln.launcher} in each of the {tasks} tasks per node, and each "
                          "starts its own workers.",
                          "#SBATCH --ntasks-per-node=1 for launcher jobs (or srun -n $SLURM_NNODES "
                          "--ntasks-per-node=1)."))
        if ln.launcher is not None and gpus and ln.nproc_per_node is not None and ln.nproc_per_node != gpus:
            out.append(_f("error", "nproc-vs-gpus",
                          f"{where}: --nproc-per-node={ln.nproc_per_node} but {gpus} GPU(s) per node are "
                          "allocated.", f"--nproc-per-node={gpus}."))
        if ln.launcher is None and ln.under_srun and gpus and tasks != gpus:
            out.append(_f("error", "tasks-vs-gpus",
                          f"{where}: srun runs one rank per task: {tasks} task(s) per node but {gpus} GPU(s) "
                          "per node.",
                          f"#SBATCH --ntasks-per-node={gpus}, or one task per node running torchrun."))
        kill = ln.srun_opts.get("kill-on-bad-exit")
        if ln.under_srun and (total > 1 or nodes > 1) and (kill is None or kill.lstrip("=") == "0"):
            who = f"one rank (or one node's {ln.launcher} agent)" if ln.launcher else "one rank"
            out.append(_f("warning", "no-kill-on-bad-exit",
                          f"{where}: srun without --kill-on-bad-exit: when {who} dies, the others wait in "
                          "their collectives until the group timeout (torch's default: 30 min) and the job "
                          "holds its nodes meanwhile.",
                          "srun --kill-on-bad-exit=1 ... (unless the cluster sets KillOnBadExit=1)."))
        if ln.rdzv_endpoint and re.search(r":\d+$", ln.rdzv_endpoint):
            out.append(_f("error", "fixed-port",
                          f"{where}: --rdzv-endpoint={ln.rdzv_endpoint} uses a fixed port; two jobs on one "
                          "node then join each other's rendezvous.",
                          "derive it from the job id: port=$((10000 + SLURM_JOB_ID * 8 % 22768)), or use "
                          "`torchslurm script --launch torchrun`."))
    return out


def _check_master(s: Script) -> list[Finding]:
    out = []
    exports = {**s.task_exports, **s.exports}
    if "NCCL_IB_DISABLE" in exports and exports["NCCL_IB_DISABLE"][1] == "1":
        out.append(_f("info", "nccl-ib-disabled",
                      f"line {exports['NCCL_IB_DISABLE'][0]}: NCCL_IB_DISABLE=1 forces NCCL onto TCP sockets "
                      "even where InfiniBand exists (much slower all-reduce).",
                      "remove it unless IB is broken on this cluster; check with NCCL_DEBUG=INFO."))
    if "MASTER_ADDR" in exports:
        line, value = exports["MASTER_ADDR"]
        if "$" not in value:
            out.append(_f("error", "hard-coded-master-addr",
                          f"line {line}: MASTER_ADDR={value} is fixed; the job's first node differs per job.",
                          "remove it: torchslurm.init() uses the first host of SLURM_JOB_NODELIST (or "
                          "head=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1))."))
    if "MASTER_PORT" in exports:
        line, value = exports["MASTER_PORT"]
        if value.isdigit():
            out.append(_f("error", "fixed-master-port",
                          f"line {line}: MASTER_PORT={value} is fixed; a second job on the same node gets "
                          "EADDRINUSE or joins this job's store.",
                          "remove it: torchslurm.init() derives the port from SLURM_JOB_ID."))
    return out


def _check_nic(s: Script) -> list[Finding]:
    return [_f("warning", "per-rank-nic",
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
        out.append(_f("error", "signal-unreachable",
                      f"--signal={sig}: `B:` sends the signal only to the batch shell, which has no trap; "
                      "the Python ranks never see it.",
                      f"--signal={name.removeprefix('B:')}@{sig.partition('@')[2]} (without B:) reaches the "
                      "tasks of every job step."))
    for ln in s.launches:
        forwarded = (ln.signals_to_handle is not None and name.removeprefix("B:") in ln.signals_to_handle) \
            or name.removeprefix("SIG") in ln.ignored
        if ln.launcher == "torchrun" and not name.startswith("B:") and not forwarded \
                and name.removeprefix("SIG") in _SIGNALS_DEFAULT_KILL:
            out.append(_f("warning", "signal-kills-torchrun",
                          f"line {ln.line}: --signal={sig} also reaches the torchrun agent, which does not "
                          "handle it and dies (the default action), taking its workers down.",
                          f"run the agent as bash -c 'trap \"\" {name.removeprefix('SIG')}; exec \"$@\"' _ "
                          "torchrun ... (workers still get the signal from Slurm)."))
    if "requeue" not in s.directives:
        out.append(_f("warning", "signal-without-requeue",
                      f"--signal={sig} without --requeue: a job that checkpoints on the signal cannot be "
                      "put back in the queue to resume.", "#SBATCH --requeue (and --open-mode=append)."))
    return out


def _check_export(s: Script) -> list[Finding]:
    if s.directives.get("export", "").upper() != "NONE":
        return []
    return [_f("error", "export-none-bare-python",
               f"line {ln.line}: --export=NONE leaves srun's tasks without PATH, so `{ln.python}` is not "
               "found (execve(): No such file or directory).",
               f"use an absolute path (e.g. /path/to/venv/bin/{ln.python}) or srun --export=ALL.")
            for ln in s.launches if "/" not in ln.python and ln.srun_opts.get("export", "").upper() != "ALL"]


def _check_batch_rank_vars(s: Script) -> list[Finding]:
    out = []
    for key, (line, value) in s.exports.items():
        m = _PER_TASK_VARS_RE.search(value)
        if m:
            out.append(_f("error", "batch-shell-rank",
                          f"line {line}: {key}={value} is evaluated once in the batch shell, where {m.group(1)} "
                          "is 0; every rank gets the same value.",
                          f"remove it: each task sets {key} from its own SLURM_* variables "
                          "(torchslurm.init() reads them)."))
    return out


def _check_output_dir(s: Script, path_exists: Callable[[str], bool] | None) -> list[Finding]:
    out = []
    for key in ("output", "error"):
        parent = str(PurePosixPath(s.directives.get(key, "x")).parent)
        if parent not in (".", "") and "%" not in parent and (path_exists is None or not path_exists(parent)):
            out.append(_f("warning", "log-dir",
                          f"--{key}={s.directives[key]}: Slurm does not create {parent}/; if it is missing the "
                          "job fails before printing anything.", f"mkdir -p {shlex.quote(parent)} before sbatch."))
    return out
