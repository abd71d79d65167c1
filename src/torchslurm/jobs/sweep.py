"""A sweep: the `sweep:` section of a job spec (or its flags), its points and their names, checked
before anything is submitted (docs/sweeps.md).

A point is a set of `key=value` overrides passed to the script after the spec's own args, plus
`run_dir=<sweep_dir>/<point dir>`: the convention of `torchslurm train`, the examples and scripts
reading `torchslurm.train.config`. The grid's points come first (a cartesian product, keys in the
order written), then the explicit ones. Pure and torch-free: the Trainer's settings are checked by
a function the caller passes (the CLI passes train.config's), so that jobs never imports train.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchslurm.configfile import load_yaml
from torchslurm.errors import ConfigError, below_minimum, shown
from torchslurm.jobs.spec import JobSpec, field_names
from torchslurm.jobs.sweepstate import Manifest, Point, PointState

SECTION_KEYS = ("name", "grid", "points", "max_parallel", "run_dir", "extra_keys")
DEFAULT_BASE = "runs"
MAX_DIR_CHARS = 80
"""A point's folder name beyond this is cut and ends in a hash of the whole name."""
ARRAY_OUTPUT = "%x-%A_%a.out"
"""An array task's log (%A the array's job id, %a the task id), in the sweep's folder unless the spec says."""
# JobSpec's summary-only fields are the Trainer's settings too: sweeping lr means the script's lr
TRAINER_FIELDS = frozenset({"lr", "batch_size"})
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")

Validator = Callable[[Sequence[str]], None]
"""Checks one point's `key=value` Trainer settings (the spec's own args' settings come first); raises
ConfigError. The CLI passes train.config's build."""


@dataclass(frozen=True)
class Sweep:
    """The `sweep:` section, flags applied."""

    name: str
    grid: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    points: tuple[Mapping[str, Any], ...] = ()
    max_parallel: int | None = None
    run_dir: Path = Path(DEFAULT_BASE)
    """The base folder: the sweep's own is `<run_dir>/<name>`."""
    extra_keys: frozenset[str] = frozenset()
    """The script's own arguments, passed on but not checked as Trainer settings."""

    @property
    def sweep_dir(self) -> Path:
        return (self.run_dir / self.name).absolute()


def section(data: object, spec: JobSpec, flags: Mapping[str, Any] | None = None) -> Sweep:
    """The Sweep of a spec file's `sweep:` mapping (None: none) with `flags` over it: `grid` (key ->
    values) replaces those keys and adds others, `points` replaces the file's, and name, max_parallel,
    run_dir win when not None. The name defaults to the job's."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"sweep: holds {shown(data)}, expected a mapping.",
                          "write sweep: {grid: {lr: [0.001, 0.0003]}, max_parallel: 2}.")
    unknown = sorted(str(k) for k in data if k not in SECTION_KEYS)
    if unknown:
        raise ConfigError(f"unknown key(s) in sweep: {', '.join(unknown)}.",
                          f"valid keys are {', '.join(SECTION_KEYS)}.")
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    grid = {**_grid(data.get("grid")), **{k: _values(k, v) for k, v in flags.get("grid", {}).items()}}
    points = _explicit(flags.get("points", data.get("points")))
    name = _given(flags.get("name", data.get("name")), spec.name)
    max_parallel = flags.get("max_parallel", data.get("max_parallel"))
    run_dir = _given(flags.get("run_dir", data.get("run_dir")), DEFAULT_BASE)
    extra = data.get("extra_keys") or []
    if not isinstance(extra, list) or not all(isinstance(k, str) for k in extra):
        raise ConfigError(f"sweep.extra_keys={shown(extra)} is not a list of names.",
                          "write extra_keys: [samples, step_sleep] (your script's own key=value arguments).")
    if not isinstance(name, str) or not name.strip() or _UNSAFE.search(name) or name in (".", ".."):
        raise ConfigError(f"sweep name {shown(name)} is not a folder name of letters, digits and . _ + -.",
                          "give --sweep-name lr-seed (or name: in the sweep: section).")
    if max_parallel is not None and (isinstance(max_parallel, bool) or not isinstance(max_parallel, int)):
        raise ConfigError(f"max_parallel={shown(max_parallel)} is not a whole number.", "e.g. --max-parallel 4.")
    if max_parallel is not None and max_parallel < 1:
        raise below_minimum("max_parallel", max_parallel, 1, "leave it out to let Slurm run every task at once.")
    if not isinstance(run_dir, str | Path):
        raise ConfigError(f"sweep.run_dir={shown(run_dir)} is not a folder.", "e.g. run_dir: runs (the default).")
    return Sweep(name, grid, points, max_parallel, Path(run_dir), frozenset(extra))


def _grid(data: object) -> dict[str, tuple[Any, ...]]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"sweep.grid={shown(data)} is not a mapping of keys to lists of values.",
                          "write grid: {lr: [0.001, 0.0003], seed: [0, 1]}.")
    return {str(k): _values(str(k), v) for k, v in data.items()}


def _values(key: str, values: object) -> tuple[Any, ...]:
    """A grid key's values: a list (a single value counts as one), each a scalar, none twice."""
    found = tuple(values) if isinstance(values, list | tuple) else (values,)
    if not found:
        raise ConfigError(f"sweep.grid.{key} has no values.", f"give at least one: {key}: [1, 2].")
    for value in found:
        _check_scalar(key, value)
    if len({_text(v) for v in found}) != len(found):
        raise ConfigError(f"sweep.grid.{key}={shown(list(found))} lists a value twice.", "give each value once.")
    return found


def _explicit(data: object) -> tuple[Mapping[str, Any], ...]:
    if data is None:
        return ()
    if not isinstance(data, list) or not all(isinstance(p, Mapping) for p in data):
        raise ConfigError(f"sweep.points={shown(data)} is not a list of mappings.",
                          "write points: [{lr: 0.01, seed: 7}, {lr: 0.1}].")
    for point in data:
        for key, value in point.items():
            _check_scalar(str(key), value)
    return tuple({str(k): v for k, v in p.items()} for p in data)


def _check_scalar(key: str, value: object) -> None:
    if not _KEY.fullmatch(key):
        raise ConfigError(f"sweep key {shown(key)} is not a setting name.", "use letters, digits and _ (e.g. lr).")
    bad_float = isinstance(value, float) and not math.isfinite(value)
    if (value is not None and not isinstance(value, str | int | float)) or bad_float:
        raise ConfigError(f"sweep value {key}={shown(value)} is not a number, a word or true/false.",
                          f"a point passes {key}=VALUE to the script: give a scalar, e.g. {key}: 0.1.")
    if isinstance(value, str) and any(c in value for c in "\n\r\0"):
        raise ConfigError(f"sweep value {key}={shown(value)} holds a line break.", "give it on one line.")


def _text(value: Any) -> str:
    """A value as the script reads it back (train.config reads values as YAML 1.2 scalars)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def parse_grid_flag(item: str) -> tuple[str, list[Any]]:
    """`--grid lr=0.1,0.01` -> ("lr", [0.1, 0.01]) (values as `flag_value` reads them)."""
    key, eq, values = item.partition("=")
    if not eq or not key or not values:
        raise ConfigError(f"--grid {item!r} is not KEY=V1,V2,....", "e.g. --grid lr=0.001,0.0003 --grid seed=0,1.")
    return key.strip(), [flag_value(v.strip()) for v in values.split(",")]


def parse_point_flag(item: str) -> dict[str, Any]:
    """`--point lr=0.1,seed=3` -> {"lr": 0.1, "seed": 3} (values as `flag_value` reads them)."""
    out: dict[str, Any] = {}
    for part in item.split(","):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--point {item!r}: {part!r} is not KEY=VALUE.", "e.g. --point lr=0.01,seed=7.")
        out[key.strip()] = flag_value(value.strip())
    return out


def flag_value(text: str) -> Any:
    """A value given on the command line: the number or true/false it spells when it reads back as the
    same text (`0.001`, `3`, `true`), else the text itself (`1e-3` and `007` reach the script as given)."""
    import yaml

    try:
        value = load_yaml(text)
    except (ConfigError, yaml.YAMLError):
        return text
    return value if isinstance(value, bool | int | float) and _text(value) == text else text


# -- points: expansion, names, checks ----------------------------------------------------------

def expand(sweep: Sweep) -> list[Point]:
    """The grid's points (cartesian product, keys in order), then the explicit points, each named."""
    combos = [dict(zip(sweep.grid, values, strict=True)) for values in itertools.product(*sweep.grid.values())] \
        if sweep.grid else []
    overrides = [*combos, *(dict(p) for p in sweep.points)]
    if not overrides:
        raise ConfigError("the sweep has no points: no grid and no explicit points.",
                          "give --grid lr=0.001,0.0003 or --point lr=0.01, or a sweep: section with grid: or points:.")
    return [Point(i, point_dir(i, o), o) for i, o in enumerate(overrides)]


def point_dir(index: int, overrides: Mapping[str, Any]) -> str:
    """`<index>-<k=v,...>`, every other character than letters, digits and `._+-` made `_`; a name
    longer than MAX_DIR_CHARS is cut and ends in a hash of the whole (the index keeps names apart)."""
    text = ",".join(f"{_UNSAFE.sub('_', k)}={_UNSAFE.sub('_', _text(v))}" for k, v in overrides.items())
    name = f"{index}-{text}" if text else str(index)
    if len(name) <= MAX_DIR_CHARS:
        return name
    digest = hashlib.sha256(repr(sorted((k, _text(v)) for k, v in overrides.items())).encode()).hexdigest()[:10]
    return f"{name[:MAX_DIR_CHARS - 11]}-{digest}"


def point_args(sweep: Sweep, point: Point) -> list[str]:
    """What array task `point.index` passes after the spec's args: its overrides, then its run_dir."""
    return [*(f"{k}={_text(v)}" for k, v in point.overrides.items()), f"run_dir={sweep.sweep_dir / point.dir}"]


def described(point: Point) -> str:
    """`point 7 (lr=0.01, seed=3)`: how messages name a point."""
    return f"point {point.index} ({', '.join(f'{k}={_text(v)}' for k, v in point.overrides.items())})"


def check(spec: JobSpec, sweep: Sweep, points: Sequence[Point], validate: Validator | None) -> None:
    """Refuse what cannot work before anything is submitted: a JobSpec field or run_dir swept, an
    `array` or `run_dir=` of the spec's own, two points alike, and (with `validate`) every point's
    Trainer settings; one ConfigError naming every point that fails."""
    problems = [*_spec_problems(spec), *_key_problems(points)]
    ConfigError.raise_any(problems)
    seen: dict[tuple[tuple[str, str], ...], Point] = {}
    for point in points:
        same = tuple(sorted((k, _text(v)) for k, v in point.overrides.items()))
        if same in seen:
            problems.append(ConfigError(f"{described(point)} repeats point {seen[same].index}.",
                                        "drop one of them (a grid value listed again as an explicit point?)."))
        seen.setdefault(same, point)
    if validate is not None:
        problems += list(_setting_problems(sweep, points, validate))
    ConfigError.raise_any(problems[:10])


def _given(value: object, default: object) -> object:
    """`value` unless left out or empty; 0 or false stay, to be refused as what they are."""
    return default if value is None or value == "" else value


def _spec_problems(spec: JobSpec) -> Iterator[ConfigError]:
    if spec.array is not None:
        yield ConfigError(f"array={spec.array}: a sweep makes its own array, one task per point.",
                          "drop --array (array: in the spec file); --max-parallel N limits how many run at once.")
    for arg in spec.args:
        if _sets_run_dir(arg):
            yield ConfigError(f"args hold {arg!r}; a sweep gives every point a run_dir of its own "
                              "(<sweep dir>/<point>).", "drop it; --sweep-dir (run_dir: in the sweep: section) "
                              "sets the folder the sweep's folder goes into.")


def _sets_run_dir(arg: str) -> bool:
    """run_dir=x, and a script's own flag: --run_dir=x, --run-dir=x, or --run-dir followed by x."""
    key = arg.partition("=")[0]
    return key.lstrip("-").replace("-", "_") == "run_dir" and ("=" in arg or key.startswith("--"))


def _key_problems(points: Sequence[Point]) -> Iterator[ConfigError]:
    keys = list(dict.fromkeys(k for p in points for k in p.overrides))
    resources = set(field_names()) - TRAINER_FIELDS
    for key in keys:
        name = key.replace("-", "_")
        if name == "run_dir":
            yield ConfigError("run_dir is swept; every point gets a run_dir of its own (<sweep dir>/<point>).",
                              "drop it from the grid and points; --sweep-dir sets where the sweep's folder goes.")
        elif name in resources:
            yield ConfigError(f"{key} is swept, but it is a job spec field: one job array has one set of "
                              "resources and one script.", f"submit one sweep per value of {key} (e.g. "
                              f"--sweep-name x-{key}1 --{name.replace('_', '-')} 1).")


def _setting_problems(sweep: Sweep, points: Sequence[Point], validate: Validator) -> Iterator[ConfigError]:
    for point in points:
        settings = [f"{k}={_text(v)}" for k, v in point.overrides.items() if k not in sweep.extra_keys]
        try:
            validate(settings)
        except ConfigError as exc:
            yield ConfigError(f"{described(point)}: {exc.message}", exc.hint)


def manifest(sweep: Sweep, points: Sequence[Point]) -> Manifest:
    """A new manifest of these points, not yet submitted."""
    return Manifest(sweep.name, sweep.sweep_dir, tuple(points))


def same_points(old: Manifest, points: Sequence[Point]) -> ConfigError | None:
    """None when the manifest already in the sweep's folder lists these points; else why not."""
    was, now = [(p.dir, dict(p.overrides)) for p in old.points], [(p.dir, dict(p.overrides)) for p in points]
    if was == now:
        return None
    differ = next((i for i, (a, b) in enumerate(zip(was, now, strict=False)) if a != b), min(len(was), len(now)))
    return ConfigError(f"{old.sweep_dir}/sweep.json lists {len(old.points)} point(s), this sweep has {len(points)}; "
                       f"they differ from point {differ} on.", "running a sweep again resubmits what has not "
                       "completed, with the same points: give the grid and points it was started with, or a new "
                       "--sweep-name for a new sweep.")


def table(manifest: Manifest, states: Sequence[PointState] | None, chosen: Sequence[int]) -> list[list[str]]:
    """The points as rows (a header first): index, whether this run submits it, its state and why,
    its overrides, its folder."""
    rows = [["point", "submit", "state", "overrides", "run_dir"]]
    for point in manifest.points:
        state = states[point.index] if states else None
        said = f"{state.state}: {state.reason}" if state and state.reason else state.state if state else "new"
        rows.append([str(point.index), "yes" if point.index in chosen else "", said,
                     ", ".join(f"{k}={_text(v)}" for k, v in point.overrides.items()), point.dir])
    return rows
