"""lint rules of what the batch shell sets up around the launches: MASTER_ADDR, NCCL settings, per-rank
NIC choices, per-task variables it expands once, --signal and its traps, --export=NONE.

Pure, nothing executed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from torchslurm.lint.parse import Script
from torchslurm.lint.rule import Facts, Flag, rule
from torchslurm.lint.shell import batch_expanded, shown

__all__: list[str] = []

_SIGNALS_DEFAULT_KILL = {"USR1", "USR2", "SIGUSR1", "SIGUSR2", "10", "12"}
_RANK_VARS_RE = re.compile(r"\$\{?(RANK|SLURM_PROCID|SLURM_NODEID|SLURM_LOCALID|LOCAL_RANK|NODE_RANK)\b")
# what torch's env:// rendezvous and most training scripts read from the environment as their own rank
_RANK_ENV = {"RANK", "LOCAL_RANK", "GROUP_RANK"}
# launcher options that carry the node's rank: the rendezvous rules judge those (a c10d rendezvous ignores them)
_RANK_OPTIONS = ("node-rank", "machine-rank")


@rule("nccl-ib-disabled", ("info",), "`NCCL_IB_DISABLE=1`: NCCL on TCP sockets even where InfiniBand exists.")
def nccl_ib_disabled(x: Facts) -> Iterator[Flag]:
    exports = {**x.script.task_exports, **x.script.exports}
    if "NCCL_IB_DISABLE" in exports and exports["NCCL_IB_DISABLE"][1] == "1":
        yield Flag("info", "NCCL_IB_DISABLE=1 forces NCCL onto TCP sockets even where InfiniBand exists (much "
                   "slower all-reduce).", "remove it unless IB is broken on this cluster; check with NCCL_DEBUG=INFO.",
                   exports["NCCL_IB_DISABLE"][0])


@rule("hard-coded-master-addr", ("error",), "`MASTER_ADDR=node01`: the first node differs per job.")
def hard_coded_master_addr(x: Facts) -> Iterator[Flag]:
    exports = {**x.script.task_exports, **x.script.exports}
    if "MASTER_ADDR" in exports:
        line, value = exports["MASTER_ADDR"]
        if "$" not in value and "`" not in value:  # $(hostname) in the batch shell: the first node, at run time
            yield Flag("error", f"MASTER_ADDR={value} is fixed; the job's first node differs per job.",
                       "remove it: torchslurm.init() uses the first host of SLURM_JOB_NODELIST (or "
                       "head=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)).", line)


def _rank_cases(s: Script) -> Iterator[int]:
    """Lines inside a `case` on the rank that set *_SOCKET_IFNAME, in each piece of shell code."""
    for body in s.bodies:
        in_case = False
        for line, text in body:
            stripped = text.strip()
            if not stripped or stripped.startswith("#"):
                continue
            if stripped.startswith("case ") and _RANK_VARS_RE.search(stripped):
                in_case = True
            if in_case and "SOCKET_IFNAME" in stripped:
                yield line
                in_case = False
            if stripped.startswith("esac"):
                in_case = False


@rule("per-rank-nic", ("warning",), "a `case` on the rank picking `*_SOCKET_IFNAME`.")
def per_rank_nic(x: Facts) -> Iterator[Flag]:
    for line in _rank_cases(x.script):
        yield Flag("warning", "a `case` on the rank picks *_SOCKET_IFNAME per node by hand; it breaks when the job "
                   "lands on other nodes or ranks move.",
                   "delete the case block: torchslurm picks, on each node, the interface that reaches the master.",
                   line)


def _signal(x: Facts) -> tuple[str, str] | None:
    """--signal as given, and the signal's name with its `B:` kept."""
    sig = x.script.directives.get("signal")
    return None if sig is None else (sig, sig.split("@")[0])


@rule("signal-unreachable", ("error",),
      "`--signal` that never reaches the program: `B:...` with no trap in the batch shell, or no `B:` while it "
      "runs in the batch shell (no srun: Slurm signals only job steps).")
def signal_unreachable(x: Facts) -> Iterator[Flag]:
    signal = _signal(x)
    if signal is None or not x.script.launches:
        return
    sig, name = signal
    traps = [c.text for c in x.script.commands if c.words[:1] == ["trap"]]
    trapped = any(name.removeprefix("B:").removeprefix("SIG") in t for t in traps)
    if name.startswith("B:") and not trapped:
        yield Flag("error", f"--signal={sig}: `B:` sends the signal only to the batch shell, which has no trap; the "
                   "Python ranks never see it.", f"--signal={name.removeprefix('B:')}@{sig.partition('@')[2]} "
                   "(without B:) reaches the tasks of every job step.")
    elif not name.startswith("B:") and not any(ln.under_srun for ln in x.script.launches):
        # without B:, Slurm signals the tasks of the job's steps (sbatch(1)), not the batch script or its children
        ln, bare = x.script.launches[0], name.removeprefix("SIG")
        yield Flag("error", f"--signal={sig} is sent only to job steps (what srun starts), but `{ln.python} ...` "
                   "runs in the batch shell, which is not one: the program never gets the signal, so it never "
                   "checkpoints or requeues before the time limit.",
                   f"srun {ln.python} ... (a step gets the signal); or --signal=B:{name}@{sig.partition('@')[2]} with "
                   f"a trap in the batch shell that passes it on: `{ln.python} ... & pid=$!; trap \"kill -{bare} "
                   f"$pid\" {bare}; wait $pid`.", ln.line)


@rule("signal-kills-torchrun", ("warning",), "`--signal` that kills the torchrun agent, which does not handle it.")
def signal_kills_torchrun(x: Facts) -> Iterator[Flag]:
    signal = _signal(x)
    if signal is None:
        return
    sig, name = signal
    for ln in x.script.launches:
        forwarded = (ln.signals_to_handle is not None and name.removeprefix("B:") in ln.signals_to_handle) \
            or name.removeprefix("SIG") in ln.ignored
        if ln.launcher == "torchrun" and ln.under_srun and not name.startswith("B:") and not forwarded \
                and name.removeprefix("SIG") in _SIGNALS_DEFAULT_KILL:
            yield Flag("warning", f"--signal={sig} also reaches the torchrun agent, which does not handle it and dies "
                       "(the default action), taking its workers down.",
                       f"run the agent as bash -c 'trap \"\" {name.removeprefix('SIG')}; exec \"$@\"' _ torchrun ... "
                       "(workers still get the signal from Slurm).", ln.line)


@rule("signal-without-requeue", ("warning",), "`--signal` without `--requeue`: the job cannot be put back in the "
      "queue to resume.")
def signal_without_requeue(x: Facts) -> Iterator[Flag]:
    signal = _signal(x)
    if signal is not None and "requeue" not in x.script.directives:
        yield Flag("warning", f"--signal={signal[0]} without --requeue: a job that checkpoints on the signal cannot "
                   "be put back in the queue to resume.", "#SBATCH --requeue (and --open-mode=append).")


@rule("export-none-bare-python", ("error",), "`--export=NONE` and a bare `python`: not found.")
def export_none_bare_python(x: Facts) -> Iterator[Flag]:
    if x.script.directives.get("export", "").upper() != "NONE":
        return
    for ln in x.script.launches:
        if "/" not in ln.python and ln.srun_opts.get("export", "").upper() != "ALL":
            yield Flag("error", f"--export=NONE leaves srun's tasks without PATH, so `{ln.python}` is not found "
                       "(execve(): No such file or directory).",
                       f"use an absolute path (e.g. /path/to/venv/bin/{ln.python}) or srun --export=ALL.", ln.line)


@rule("batch-shell-rank", ("error", "warning"),
      "a per-task variable expanded once by the batch shell where it matters: `srun python train.py "
      "--rank=$SLURM_PROCID` (error), or `export RANK=$SLURM_PROCID` before srun (warning: an error when a launch "
      "line passes it on). A variable never used, or a rank a c10d rendezvous ignores, is not reported.")
def batch_shell_rank(x: Facts) -> Iterator[Flag]:
    s = x.script
    yield from _exported_ranks(s)
    yield from _launch_words(s)


def _exported_ranks(s: Script) -> Iterator[Flag]:
    """`export RANK=$SLURM_PROCID` before srun: every task inherits the batch shell's 0. A variable that is
    not exported, or that no program reads as its rank, does no harm unless a launch line uses it."""
    if not any(ln.under_srun for ln in s.launches):
        return
    for key, (line, value) in s.exports.items():
        name = batch_expanded(value)
        if not (name and key in _RANK_ENV and key in s.exported):
            continue
        hint = f"remove it: each task sets {key} from its own SLURM_* variables (torchslurm.init() reads them)."
        if _passed_on(s, key):
            yield Flag("error", f"{key}={shown(value)} is evaluated once in the batch shell, where {name} is 0, and a "
                       "launch line passes it on: every rank gets the same value.", hint, line)
        else:  # torch's env:// reads RANK, LOCAL_RANK; many programs read their own variables instead
            yield Flag("warning", f"{key}={shown(value)} is evaluated once in the batch shell, where {name} is 0, and "
                       f"every task inherits it: a program that reads {key} (torch's env:// rendezvous does) gets the "
                       "same rank everywhere.", hint, line)


def _passed_on(s: Script, key: str) -> bool:
    """A launch line hands `$key` to the launcher or the program (`--node_rank=$RANK`, `--rank $RANK`)."""
    lines = {ln.line for ln in s.launches}
    used = re.compile(r"\$\{?" + key + r"\b")
    return any(c.line in lines and used.search(" ".join(c.words[1:])) for c in s.commands)


def _launch_words(s: Script) -> Iterator[Flag]:
    """`srun python train.py --rank=$SLURM_PROCID`: the batch shell expands it once, to 0, for every task."""
    for ln in s.launches:
        if not ln.under_srun:
            continue
        skip = {ln.launcher_opts.get(key) for key in _RANK_OPTIONS}
        for word in ln.words:
            name = batch_expanded(word)
            if name is None or word in skip or any(word.lstrip("-").replace("_", "-").startswith(key + "=")
                                                   for key in _RANK_OPTIONS):
                continue
            yield Flag("error", f"`{shown(word)}` is expanded once, by the batch shell before srun starts, where "
                       f"{name} is 0: every task gets the same value.",
                       f"let each task expand it: srun bash -c '... ${name} ...' (single quotes), or drop it: "
                       "torchslurm.init() and the launchers give each rank its own.", ln.line)
            break
