"""JobSpec: what a user wants from Slurm (N nodes x M GPUs, launch mode, time), validated.

Pure: no torch, no Slurm commands. A JobSpec is normalised first (lists to tuples, `time: 90`
to "90", `sigusr1` to USR1), then `problems()` rejects values that can never work (wrong types,
unknown choices, newlines that would break out of a script line) with a ConfigError; combinations
that are legal but likely wrong are `findings.validate()`'s job. Every message names a field
through a `Spelling`, so the command line can say the same with its flags."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchslurm.configfile import read_mapping, unknown_keys_error
from torchslurm.errors import ConfigError, below_minimum, not_one_of, shown
from torchslurm.jobs.interpreter import python_problem
from torchslurm.jobs.slurmvalues import array_problem, mem_problem, parse_time
from torchslurm.jobs.spelling import SPEC_FILE, Spelling

LAUNCH_MODES = ("srun", "torchrun")
BACKENDS = ("auto", "gloo", "nccl")
GPU_FLAGS = ("gpus-per-node", "gres")
# Signals a Python process can catch without side effects in Slurm or torch. USR2 is the default
# because NCCL/UCX may install their own USR1 handler.
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "URG")

_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HELP = "help"  # the key of a field's documentation in its dataclasses.Field.metadata, where `--help` reads it


def _help(text: str) -> dict[str, str]:
    return {_HELP: text}


@dataclass(frozen=True)
class JobSpec:
    """One training job. Field names are the keys of a spec file; CLI flags spell them with `-`.

    Each field's documentation is its `help` metadata (`field_help(name)`), shown by `--help`.
    """

    script: str = field(metadata=_help("Path of the Python training script run on every rank."))
    args: tuple[str, ...] = field(default=(), metadata=_help(
        "Arguments passed to the script, each one as given (quoted in the job script)."))
    name: str = field(default="", metadata=_help(
        "Slurm job name (`--job-name`); `%x` in output patterns. Default: the script's name (`train.py` -> train)."))
    nodes: int = field(default=1, metadata=_help("Number of nodes (`--nodes`)."))
    gpus_per_node: int = field(default=0, metadata=_help("GPUs per node; 0 makes a CPU job (Gloo)."))
    launch: str = field(default="srun", metadata=_help(
        "`srun`: one Slurm task per rank (per GPU); `torchrun`: one task per node running torchrun."))
    tasks_per_node: int | None = field(default=None, metadata=_help(
        "Slurm tasks per node. Default: gpus_per_node (or 1 for a CPU job) in srun mode, 1 in torchrun mode."))
    nproc_per_node: int | None = field(default=None, metadata=_help(
        "torchrun mode only: worker processes per node. Default: gpus_per_node (or 1 for a CPU job)."))
    cpus_per_task: int | None = field(default=None, metadata=_help("CPUs per Slurm task (`--cpus-per-task`)."))
    mem: str | None = field(default=None, metadata=_help("Memory per node (`--mem`), e.g. `32G`."))
    time: str | None = field(default=None, metadata=_help(
        "Time limit (`--time`): minutes, `H:MM:SS` or `D-HH:MM:SS`."))
    partition: str | None = field(default=None, metadata=_help("Slurm partition (`--partition`)."))
    account: str | None = field(default=None, metadata=_help("Account charged (`--account`)."))
    qos: str | None = field(default=None, metadata=_help("Quality of service (`--qos`)."))
    constraint: str | None = field(default=None, metadata=_help("Node features required (`--constraint`)."))
    nodelist: str | None = field(default=None, metadata=_help("Nodes to use (`--nodelist`), a Slurm hostlist."))
    exclude: str | None = field(default=None, metadata=_help("Nodes to avoid (`--exclude`), a Slurm hostlist."))
    output: str = field(default="%x-%j.out", metadata=_help(
        "stdout file pattern of the job (`--output`); `%x` job name, `%j` job id."))
    error: str | None = field(default=None, metadata=_help(
        "stderr file pattern (`--error`); default: merged into `output`."))
    per_rank_output: bool = field(default=False, metadata=_help(
        "Also write one file per Slurm task (`srun --output=<output stem>-rank%t.out`)."))
    setup: tuple[str, ...] = field(default=(), metadata=_help(
        "Shell lines run before launch (module load, venv activation). Shell code, run as written."))
    env: Mapping[str, str] = field(default_factory=dict, metadata=_help(
        "Extra environment variables exported to every rank (NCCL_DEBUG, ...)."))
    backend: str = field(default="auto", metadata=_help(
        "Process group backend: auto (nccl with GPUs, else gloo), gloo or nccl."))
    nic: str | None = field(default=None, metadata=_help(
        "Network interface override (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME); default: chosen per node."))
    preemptible: bool = field(default=False, metadata=_help(
        "Ask Slurm for a warning signal before the time limit, and requeue after a stop."))
    signal: str = field(default="USR2", metadata=_help(
        "When preemptible: signal sent `grace_s` seconds before the end (`--signal`); USR2, as NCCL may catch USR1."))
    grace_s: int = field(default=120, metadata=_help(
        "When preemptible: seconds between the warning signal and the time limit."))
    requeue: bool = field(default=True, metadata=_help(
        "When preemptible: allow the job to be requeued (`--requeue`)."))
    max_requeues: int = field(default=3, metadata=_help(
        "When preemptible: how many times rank 0 may requeue the job (checked against SLURM_RESTART_COUNT)."))
    max_restarts: int = field(default=0, metadata=_help(
        "torchrun mode: how often the agents restart all workers after a rank fails (`--max-restarts`); "
        "the restarted workers resume from the last checkpoint (resume=auto)."))
    array: str | None = field(default=None, metadata=_help(
        "Job array indexes for sweeps (`--array`), e.g. `0-9%2`."))
    python: str = field(default="python", metadata=_help(
        "The command that runs Python on the compute nodes: `python` from PATH, a venv's interpreter, or "
        "Python in a container (`apptainer exec --nv image.sif python`)."))
    gpu_flag: str = field(default="gpus-per-node", metadata=_help(
        "How GPUs are requested: `gpus-per-node` (Slurm >= 19.05) or `gres` (`--gres=gpu:N`)."))
    batch_size: int | None = field(default=None, metadata=_help(
        "Optional: per-rank batch size, only used for the effective batch size summary."))
    lr: float | None = field(default=None, metadata=_help(
        "Optional: base learning rate, only used for the LR scaling summary."))

    def __post_init__(self) -> None:
        for name, value in normalised(self).items():
            object.__setattr__(self, name, value)  # frozen: the one place a JobSpec's fields are set
        found = problems(self)
        if found:
            raise InvalidSpec(self, found)

    @property
    def ranks_per_node(self) -> int:
        """Training processes per node in either launch mode."""
        if self.launch == "torchrun":
            return self.nproc_per_node or max(self.gpus_per_node, 1)
        return self.slurm_tasks_per_node

    @property
    def slurm_tasks_per_node(self) -> int:
        """What `--ntasks-per-node` the script asks Slurm for."""
        if self.tasks_per_node is not None:
            return self.tasks_per_node
        return 1 if self.launch == "torchrun" else max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def time_s(self) -> int | None:
        """The time limit in seconds, or None when unlimited / not given."""
        return None if self.time is None else parse_time(self.time)

    def to_dict(self) -> dict[str, Any]:
        """The fields that differ from the defaults, in field order (the script header shows this)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if value != default:  # script has no default: always there
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(JobSpec)]


def field_help(name: str) -> str:
    """The documentation of field `name` (one sentence or two), as `--help` shows it."""
    return str(_FIELDS[name].metadata[_HELP])


_FIELDS = {f.name: f for f in dataclasses.fields(JobSpec)}


def load(path: Path | None = None, overrides: Mapping[str, Any] | None = None,
         command: str = "torchslurm submit --nodes 2") -> JobSpec:
    """A spec from a YAML/TOML file and/or flag values; flags (non-None overrides) win.

    `command`: the command line that was run, quoted with the script added when none was given."""
    data: dict[str, Any] = read_file(path) if path is not None else {}
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return from_mapping(data, source=str(path) if path else "flags", command=command)


def read_file(path: Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml/.json) or TOML (.toml) spec file into a dict, keys normalised."""
    return read_mapping(path, f"job spec {path}", field_names())


def from_mapping(data: Mapping[str, Any], source: str = "spec", command: str = "torchslurm submit --nodes 2",
                 spelling: Spelling = SPEC_FILE) -> JobSpec:
    """Build a JobSpec from plain data, rejecting unknown keys with the list of valid ones; invalid values
    are reported with their fields named as `spelling` names them."""
    valid = field_names()
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise unknown_keys_error(source, unknown, valid)
    if "script" not in data:
        raise ConfigError(f"no `script` in {source}.", f"give the training script after the flags "
                          f"(`{command} train.py`) or as `script: train.py` in the --spec file.")
    try:
        return JobSpec(**data)
    except InvalidSpec as exc:
        if spelling == SPEC_FILE:
            raise
        raise exc.spelled(spelling) from None


def spec_json(spec: JobSpec) -> str:
    """A stable one-line JSON form of the spec (non-default fields), used in script headers."""
    return json.dumps(spec.to_dict(), ensure_ascii=True)  # in to_dict's order: the fields'


# -- normalising and checking: __post_init__ normalises, then asks problems() -------------------

class InvalidSpec(ConfigError):
    """JobSpec's refusal. It keeps the refused spec, so that the command line can have the same
    problems said with its flags (`spelled`)."""

    def __init__(self, spec: JobSpec, found: Sequence[ConfigError]) -> None:
        one = ConfigError.combined(found)
        super().__init__(one.message, one.hint, problems=one.problems)
        self.spec = spec

    def spelled(self, spelling: Spelling) -> InvalidSpec:
        return InvalidSpec(self.spec, problems(self.spec, spelling))


_INT_FIELDS = ("nodes", "gpus_per_node", "grace_s", "max_requeues", "max_restarts")
_OPT_INT_FIELDS = ("tasks_per_node", "nproc_per_node", "cpus_per_task", "batch_size")
_BOOL_FIELDS = ("per_rank_output", "preemptible", "requeue")
_OPT_STR_FIELDS = ("mem", "time", "partition", "account", "qos", "constraint", "nodelist", "exclude",
                   "error", "nic", "array")
_STR_FIELDS = ("script", "name", "launch", "output", "backend", "signal", "python", "gpu_flag")
_MINIMUM = {"nodes": 1, "gpus_per_node": 0, "tasks_per_node": 1, "nproc_per_node": 1, "cpus_per_task": 1,
            "grace_s": 1, "max_requeues": 0, "max_restarts": 0, "batch_size": 1}
_ITEM = {"args": "argument", "setup": "shell line"}
_QUOTED = '"..."'


def normalised(spec: JobSpec) -> dict[str, Any]:
    """The canonical form of the fields that have one (lists -> tuples, sorted env, `time: 90` -> "90",
    `sigusr1` -> "USR1"). Refuses only what has no canonical form (a string where a list belongs)."""
    out: dict[str, Any] = {
        "args": tuple(str(a) for a in _as_sequence("args", spec.args)),
        "setup": tuple(str(s) for s in _as_sequence("setup", spec.setup)),
        "env": dict(sorted(_check_env(spec.env).items())),
    }
    for name in ("time", "mem"):  # `time: 90` in YAML means 90 minutes, as `--time=90` does
        value = getattr(spec, name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = str(value)
    if isinstance(spec.signal, str):
        out["signal"] = spec.signal.upper().removeprefix("SIG")
    if spec.name == "" and isinstance(spec.script, str):  # jobs differ by script: so do their names and run dirs
        out["name"] = Path(spec.script).stem.strip() or "torchslurm"
    return out


def problems(spec: JobSpec, spelling: Spelling = SPEC_FILE) -> list[ConfigError]:
    """Every value of `spec` that can never work, its field named as `spelling` names it. Wrong types
    alone when there are any: the other checks compare values and need the right types."""
    wrong_types = [p for p in _type_problems(spec, spelling) if p]
    if wrong_types:
        return wrong_types
    checks = (_choice_problems, _range_problems, _text_problems)
    return [p for check in checks for p in check(spec, spelling) if p]


def _as_sequence(name: str, value: object) -> Sequence[object]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        example = (json.dumps(value.split() if name == "args" else [value]) if isinstance(value, str)
                   else '["...", "..."]')  # setup: one line as given; args: one item per word
        raise ConfigError(f"{name}={shown(value)} is a {type(value).__name__}, expected a list of strings.",
                          f"write {name}: {example} (a list, one item per {_ITEM[name]}).")
    return value


def _check_env(env: object) -> dict[str, str]:
    if not isinstance(env, Mapping):
        raise ConfigError(f"env={shown(env)} is not a mapping.", "write env: {NCCL_DEBUG: INFO}.")
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_KEY_RE.fullmatch(key):
            raise ConfigError(f"env key {shown(key)} is not a shell variable name.",
                              "use letters, digits and `_`, not starting with a digit.")
        if not isinstance(value, str | int | float):  # a list, a mapping, or None (YAML's `KEY:` alone)
            raise ConfigError(f"env {key}={shown(value)}: expected text or a number.", f'e.g. {key}: "0,1", or "".')
        out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _type_problems(spec: JobSpec, sp: Spelling) -> Iterator[ConfigError]:
    for name in _INT_FIELDS + _OPT_INT_FIELDS:
        value = getattr(spec, name)
        if not (value is None and name in _OPT_INT_FIELDS) and (isinstance(value, bool) or not isinstance(value, int)):
            yield ConfigError(f"{sp.name(name)}={shown(value)} is not an integer.",
                              f"write {sp.setting(name, 2)} (a whole number).")
    for name in _BOOL_FIELDS:
        if not isinstance(getattr(spec, name), bool):
            yield ConfigError(f"{sp.name(name)}={shown(getattr(spec, name))} is not true/false.",
                              f"write {sp.setting(name, True)}.")
    for name in _STR_FIELDS + _OPT_STR_FIELDS:
        value = getattr(spec, name)
        if not (isinstance(value, str) or (value is None and name in _OPT_STR_FIELDS)):
            yield ConfigError(f"{sp.name(name)}={shown(value)} is not a string.",
                              f"quote it: {sp.setting(name, _QUOTED)}.")
    if spec.lr is not None and (isinstance(spec.lr, bool) or not isinstance(spec.lr, int | float)):
        yield ConfigError(f"{sp.name('lr')}={shown(spec.lr)} is not a number.", f"write {sp.setting('lr', 0.001)}.")


def _choice_problems(spec: JobSpec, sp: Spelling) -> Iterator[ConfigError | None]:
    for name, choices in (("launch", LAUNCH_MODES), ("backend", BACKENDS), ("gpu_flag", GPU_FLAGS),
                          ("signal", SIGNALS)):
        value = getattr(spec, name)
        yield None if value in choices else not_one_of(sp.name(name), value, choices)
    if spec.time is not None:
        try:
            parse_time(spec.time, sp.name("time"))
        except ConfigError as exc:
            yield exc
    yield None if spec.mem is None else mem_problem(spec.mem, sp)
    yield None if spec.array is None else array_problem(spec.array, sp)


def _range_problems(spec: JobSpec, sp: Spelling) -> Iterator[ConfigError]:
    for name, low in _MINIMUM.items():
        value = getattr(spec, name)
        if value is not None and value < low:
            yield below_minimum(sp.name(name), value, low)
    launch = f"{sp.name('launch')}={shown(spec.launch)}"
    if spec.max_restarts and spec.launch != "torchrun":
        yield ConfigError(f"{sp.given('max_restarts', spec.max_restarts)} with {launch}: only torchrun's agent "
                          "restarts workers.", "in srun mode a failed rank ends the step (--kill-on-bad-exit) and "
                          f"the job is requeued ({sp.setting('preemptible', True)}, {sp.name('max_requeues')}); "
                          f"or set {sp.setting('launch', 'torchrun')}.")
    if spec.nproc_per_node is not None and spec.launch != "torchrun":
        yield ConfigError(f"{sp.given('nproc_per_node', spec.nproc_per_node)} with {launch}: only torchrun starts "
                          f"several processes per task.", f"use {sp.name('tasks_per_node')} in srun mode, or set "
                          f"{sp.setting('launch', 'torchrun')}.")


def _text_problems(spec: JobSpec, sp: Spelling) -> Iterator[ConfigError | None]:
    """Newlines or NULs would end a `#SBATCH` or command line early; the rest would run as shell code."""
    values: list[tuple[str, str]] = [(n, getattr(spec, n)) for n in _STR_FIELDS + _OPT_STR_FIELDS
                                     if getattr(spec, n) is not None]
    values += [("args", a) for a in spec.args] + [("setup", s) for s in spec.setup]
    values += [(f"env.{k}", v) for k, v in spec.env.items()]
    for name, value in values:
        yield _encoding_problem(sp.name(name), value)
        bad = next((c for c in ("\n", "\r", "\0") if c in value), None)
        if bad is not None:
            yield ConfigError(f"{sp.name(name)}={shown(value)} contains {bad!r}; a job script line cannot hold it "
                              f"safely.", f"remove the line break from {sp.name(name)} (for several setup lines "
                              "give a list).")
    if "/" in spec.name:
        yield ConfigError(f"{sp.name('name')}={shown(spec.name)} contains '/'; Slurm puts the name into log file names "
                          "(%x).", f"use a name without '/', e.g. {shown(spec.name.replace('/', '-'))}.")
    if spec.script.startswith("-"):  # python would read it as one of its options (`-c CODE` runs code)
        yield ConfigError(f"{sp.name('script')}={shown(spec.script)} starts with '-', so it would be read as an "
                          f"option, not a path.", f"write it as a path: {sp.setting('script', './' + spec.script)}.")
    yield python_problem(spec.python, sp)  # srun would read a leading '-' as one of its options
    for name in ("script", "name", "python", "output"):
        if not getattr(spec, name).strip():
            yield ConfigError(f"{sp.name(name)} is empty.", f"give a value for {sp.name(name)}.")


def _encoding_problem(name: str, value: str) -> ConfigError | None:
    """A lone surrogate (e.g. from a mis-decoded file name) cannot be written into a UTF-8 script."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return ConfigError(f"{name}={shown(value)} holds {value[exc.start]!r}, which cannot be written as UTF-8 into a "
                           f"job script.", f"give {name} as plain text; file names must decode as UTF-8.")
    return None
