"""Settings files: a flat YAML (.yaml/.yml/.json) or TOML (.toml) mapping. Shared by the training
config and the job spec, both of which must load on a login node without torch."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchslurm.errors import ConfigError

if TYPE_CHECKING:
    import yaml

# YAML 1.1's int and float, without base-60 numbers
_INT = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$")
_FLOAT = re.compile(r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_NUMBERS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


@functools.cache
def _loader() -> type[yaml.SafeLoader]:
    """YAML 1.1 without its base-60 numbers, so that `time: 1:00:00` stays the string Slurm reads
    (one hour) instead of the integer 3600, which Slurm would read as 3600 minutes. Built on first
    use: most commands read no file, and importing yaml is a good part of their start-up."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {  # copies: SafeLoader's own stay as they are
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _NUMBERS]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
    return Loader


def load_yaml(text: str) -> Any:
    """yaml.safe_load, except that `1:00:00` and `30:00` are strings (Slurm times), not base-60 numbers."""
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
    guesses = [f"{key} -> {close[0]}" for key in unknown if (close := difflib.get_close_matches(key, valid, n=1))]
    did_you_mean = f"did you mean {', '.join(guesses)}? " if guesses else ""
    return ConfigError(f"unknown key(s) in {source}: {', '.join(unknown)}.",
                       f"{did_you_mean}valid keys are {', '.join(valid)}.")
