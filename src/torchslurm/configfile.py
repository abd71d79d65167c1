"""Settings files: a flat YAML (.yaml/.yml/.json) or TOML (.toml) mapping. Shared by the training
config and the job spec, both of which must load on a login node without torch."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchslurm.errors import ConfigError

if TYPE_CHECKING:
    import yaml

# YAML 1.2's core-schema numbers (decimal, 0o octal, 0x hex; floats with or without a dot, so
# 3e-4 is a number), with `_` between digits allowed as in TOML and Python.
_INT = re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7_]+|0x[0-9a-fA-F_]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_REPLACED = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp")


def _int(text: str) -> int:
    """Decimal unless it says 0o or 0x: `010` is ten (YAML 1.1 read it as octal 8)."""
    digits = text.replace("_", "")
    return int(digits, 0) if digits[:2] in ("0o", "0x") else int(digits, 10)


def _float(text: str) -> float:
    lowered = text.replace("_", "").lower()
    return float(lowered.replace(".inf", "inf").replace(".nan", "nan"))


@functools.cache
def _loader() -> type[yaml.SafeLoader]:
    """PyYAML's SafeLoader with YAML 1.2's numbers and no dates. PyYAML implements YAML 1.1, where
    `seed: 010` is octal 8, `lr: 3e-4` is a string (1.1 floats need a dot), `name: 2024-01-01` is a
    date and `time: 1:00:00` is the base-60 integer 3600, which Slurm would read as 3600 minutes.
    Here those are 10, 0.0003, the text 2024-01-01 and the Slurm time written. Built on first use:
    most commands read no file, and importing yaml is a good part of their start-up."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {  # copies: SafeLoader's own stay as they are
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _REPLACED]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
    def number(read: Callable[[str], int | float]) -> Callable[[yaml.SafeLoader, yaml.Node], int | float]:
        def construct(loader: yaml.SafeLoader, node: yaml.Node) -> int | float:
            assert isinstance(node, yaml.ScalarNode)  # the resolvers above tag scalars only
            return read(str(loader.construct_scalar(node)))
        return construct

    Loader.add_constructor("tag:yaml.org,2002:int", number(_int))
    Loader.add_constructor("tag:yaml.org,2002:float", number(_float))
    return Loader


def load_yaml(text: str) -> Any:
    """yaml.safe_load with YAML 1.2's numbers and no dates (see _loader): `3e-4` and `010` are the
    numbers they look like, `2024-01-01` and `1:00:00` stay text."""
    import yaml

    return yaml.load(text, Loader=_loader())  # a SafeLoader: no arbitrary objects


def read_mapping(path: Path, label: str, valid_keys: Iterable[str]) -> dict[str, Any]:
    """The file's top-level mapping with `-` in keys turned into `_`; `label` names it in errors."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {label}: {exc.strerror}.", "check the path.") from exc
    import tomllib

    import yaml

    suffix = Path(path).suffix
    try:
        raw = tomllib.loads(text) if suffix == ".toml" else load_yaml(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{label} is not valid {suffix[1:] or 'YAML'}: {exc}.",
                          "fix the syntax at the position shown.") from exc
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{label} holds a {type(raw).__name__}, expected a mapping.",
                          f"write `key: value` lines; valid keys: {', '.join(valid_keys)}.")
    return {str(k).replace("-", "_"): v for k, v in raw.items()}


def unknown_keys_error(source: str, unknown: Sequence[str], valid: Sequence[str]) -> ConfigError:
    """The error for keys a spec or config does not have, with the closest valid key for each typo."""
    guesses = [f"{key} -> {close[0]}" for key in unknown
               if (close := difflib.get_close_matches(key.lstrip("_"), valid, n=1))]
    did_you_mean = f"did you mean {', '.join(guesses)}? " if guesses else ""
    if any(key.startswith("__") for key in unknown):  # `--tasks-per-node: 2`: a flag's spelling in a file
        did_you_mean += "a file's keys have no leading -- (tasks_per_node: 2 or tasks-per-node: 2); "
    return ConfigError(f"unknown key(s) in {source}: {', '.join(unknown)}.",
                       f"{did_you_mean}valid keys are {', '.join(valid)}.")
