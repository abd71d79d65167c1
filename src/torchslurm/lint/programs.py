"""What a command runs, as lint reads it: wrappers seen through (`env`, `apptainer exec`, `enroot start`, ...),
the launchers that start ranks (torchrun, deepspeed, accelerate, colossalai, gpt-neox's deepy.py, NVIDIA's
multiproc.py, and their `python -m` forms), plain python training (`python train.py`, `python -m pkg.train`),
and a launcher's own options up to the training script. Pure, part of `lint`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Set as AbstractSet
from pathlib import PurePosixPath

from torchslurm.lint.options import ACCELERATE_FLAGS, DEEPSPEED_FLAGS, LAUNCHER_FLAGS
from torchslurm.lint.shell import ASSIGN_RE
from torchslurm.runtime.launch import AGENT_MODULE
from torchslurm.runtime.variables import is_digits

__all__ = ["launcher_args", "procs_per_node", "program_name", "started", "unwrap"]

_PYTHON_RE = re.compile(r"python([0-9]+(\.[0-9]+)?)?")
_LAUNCH_MODULES = {"torch.distributed.run": "torchrun", AGENT_MODULE: "torchrun",
                   "torch.distributed.launch": "torch.distributed.launch",
                   "accelerate.commands.launch": "accelerate", "deepspeed.launcher.runner": "deepspeed",
                   "multiproc": "multiproc", "apex.parallel.multiproc": "multiproc"}
# launcher scripts run by python: gpt-neox's deepy.py (deepspeed's runner), NVIDIA's multiproc.py (a process per GPU)
_LAUNCH_SCRIPTS = {"deepy.py": "deepy", "multiproc.py": "multiproc"}
# `python -m MODULE` that sets up or inspects, never trains
_TOOL_MODULES = frozenset({"pip", "venv", "ensurepip", "json.tool", "http.server", "site", "compileall", "py_compile",
                           "timeit", "pytest", "torch.utils.collect_env"})
# python's own options (`python -u -X faulthandler -m ...`): flags that may be grouped, and those taking a value
_PYTHON_FLAGS_RE = re.compile(r"-[bBdEiIOqsSuvR]+")
_PYTHON_VALUED = ("-X", "-W")
# each launcher's options that take no value
_LAUNCHER_FLAGS: dict[str, AbstractSet[str]] = {
    "torchrun": LAUNCHER_FLAGS, "torch.distributed.launch": LAUNCHER_FLAGS,
    "deepspeed": DEEPSPEED_FLAGS, "accelerate": ACCELERATE_FLAGS, "colossalai": LAUNCHER_FLAGS,
    "deepy": LAUNCHER_FLAGS, "multiproc": LAUNCHER_FLAGS,
}


def launcher_args(launcher: str | None, args: list[str]) -> dict[str, str]:
    """The launcher's own options, `-` spelling (`--opt=v`, `--opt v`, `-r 3`, flags as ""), up to the
    training script: argparse ends them at the first operand, the rest are the script's arguments.
    Plain python (`launcher` None) has none lint reads."""
    if launcher is None:
        return {}
    flags = _LAUNCHER_FLAGS[launcher]
    into: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        if args[i] == "--":
            break
        key, eq, value = _dashes(args[i]).lstrip("-").partition("=")
        if len(key) > 1 and not args[i].startswith("--"):  # `-r3`: a short option with its value attached
            key, value, eq = key[0], key[1:], "="
        if not eq and key not in flags and i + 1 < len(args):
            value, i = args[i + 1], i + 1
        into[key] = value
        i += 1
    return into


_SINGULARITY_FLAGS = frozenset({
    "nv", "nvccli", "rocm", "cleanenv", "e", "contain", "containall", "C", "c", "writable", "w", "writable-tmpfs",
    "fakeroot", "f", "no-home", "no-privs", "keep-privs", "userns", "u", "pid", "p", "ipc", "i", "net", "n", "uts",
    "compat", "no-init", "no-nv", "no-eval", "disable-cache", "no-https", "allow-setuid", "no-umask", "sharens",
})
_SINGULARITY_GLOBAL_FLAGS = frozenset({"d", "debug", "nocolor", "q", "quiet", "s", "silent", "v", "verbose"})
_ENROOT_FLAGS = frozenset({"root", "r", "rw", "w"})


@functools.lru_cache(maxsize=1024)
def program_name(word: str) -> str:
    """The program a command word names: `/usr/bin/srun` -> `srun` (kept for the words a script repeats: a
    path is slow to build, and a long script names the same few programs on every line)."""
    return PurePosixPath(word).name


def unwrap(words: list[str]) -> list[str] | None:
    """The command a wrapper runs (`env X=1 cmd`, `apptainer exec --nv img.sif cmd`, `enroot start img cmd`,
    `nohup`, `stdbuf`, `numactl`), or None when words[0] wraps nothing lint knows."""
    name = program_name(words[0])
    if name in ("env", "nohup", "stdbuf", "numactl", "time", "exec", "command", "setsid", "ionice", "nice"):
        rest = words[1:]
        while rest and (rest[0].startswith("-") or (name == "env" and ASSIGN_RE.match(rest[0]))):
            takes_value = name in ("numactl", "ionice", "nice") and "=" not in rest[0] and len(rest[0]) == 2
            rest = rest[2:] if takes_value else rest[1:]
        return rest
    if name == "timeout":
        rest = [w for w in words[1:]]
        while rest and rest[0].startswith("-"):
            rest = rest[1:]
        return rest[1:]
    if name in ("apptainer", "singularity"):
        rest = _after_options(words[1:], _SINGULARITY_GLOBAL_FLAGS)  # `apptainer --quiet exec ...`
        if rest[:1] in (["exec"], ["run"]):
            return _after_options(rest[1:], _SINGULARITY_FLAGS)[1:]  # the image, then the command
        return None
    if name == "enroot" and len(words) > 1 and words[1] in ("start", "exec"):
        return _after_options(words[2:], _ENROOT_FLAGS)[1:]
    return None


def _after_options(words: list[str], flags: frozenset[str]) -> list[str]:
    """The words after a command's options: `--opt=v`, a flag in `flags`, `--opt v`; a short option is one
    word when its value or other flags are attached (`-B/data:/data`, `-ce`), as Go's pflag reads them."""
    i = 0
    while i < len(words) and words[i].startswith("-"):
        word = words[i]
        key = word.lstrip("-")
        attached = "=" in key or (not word.startswith("--") and len(key) > 1)
        i += 1 if attached or key in flags else 2
    return words[i:]


def started(words: list[str]) -> tuple[str | None, list[str]] | None:
    """What `words` start: a launcher (its name, and the words after it), plain python training (None and its
    arguments: `python train.py`, `python -m pkg.train`), or None when they start no training."""
    name, rest = program_name(words[0]), words[1:]
    if name in ("torchrun", "deepspeed"):
        return name, rest
    if name == "accelerate" and rest[:1] == ["launch"]:
        return "accelerate", rest[1:]
    if name == "colossalai" and rest[:1] == ["run"]:
        return "colossalai", rest[1:]
    if not _PYTHON_RE.fullmatch(name):
        return None
    after = _after_python_options(rest)
    if len(after) >= 2 and after[0] == "-m":  # `python -u -m torch.distributed.run`, `python -m pkg.train`
        module = after[1]
        if module in _LAUNCH_MODULES:
            return _LAUNCH_MODULES[module], after[2:]
        return None if module.split(".")[0] in _TOOL_MODULES or module in _TOOL_MODULES else (None, after[2:])
    if not after or after[0].startswith("-"):
        return None  # `python -c ...`, `python --version`, an interactive python: not training
    script = program_name(after[0])
    return (_LAUNCH_SCRIPTS[script], after[1:]) if script in _LAUNCH_SCRIPTS else (None, after)


def _after_python_options(args: list[str]) -> list[str]:
    """python's arguments after its own options (`-u`, `-OO`, `-X faulthandler`, `-W ignore`)."""
    i = 0
    while i < len(args):
        if _PYTHON_FLAGS_RE.fullmatch(args[i]):
            i += 1
        elif args[i] in _PYTHON_VALUED:
            i += 2
        elif args[i].startswith(_PYTHON_VALUED):  # `-Xfaulthandler`
            i += 1
        else:
            break
    return args[i:]


def procs_per_node(launcher: str | None, opts: dict[str, str]) -> int | None:
    """Processes each launcher starts on its node, where literal."""
    if launcher == "deepspeed":
        value = opts.get("num-gpus")
    elif launcher == "accelerate":
        procs, machines = opts.get("num-processes", ""), opts.get("num-machines", "1")
        if is_digits(procs) and is_digits(machines) and int(machines) > 0:
            return int(procs) // int(machines)
        return None
    else:
        value = opts.get("nproc-per-node")
    return int(value) if value and is_digits(value) else None


def _dashes(word: str) -> str:
    """`--nproc_per_node=8` -> `--nproc-per-node=8` (launchers accept both spellings)."""
    if not word.startswith("--"):
        return word
    key, eq, value = word.partition("=")
    return key.replace("_", "-") + eq + value
