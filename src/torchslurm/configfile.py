"""Settings files: a flat YAML (.yaml/.yml/.json) or TOML (.toml) mapping. Shared by the training
config and the job spec, both of which must load on a login node without torch.

Whatever a file holds, reading it is bounded: at most MAX_FILE_BYTES of UTF-8 text, values nested
at most MAX_DEPTH deep, at most MAX_VALUES values once YAML aliases are expanded (an "alias bomb"
of a few hundred bytes would otherwise expand to millions), integers of at most MAX_DIGITS digits,
and no key given twice. Anything else is a ConfigError with a HINT, never a traceback."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchslurm.errors import ConfigError, shown

if TYPE_CHECKING:
    import yaml

MAX_FILE_BYTES = 256 << 10
MAX_DEPTH = 32
MAX_VALUES = 10_000
MAX_DIGITS = 100  # no setting takes a longer integer; Python's int() refuses past 4300 digits

# YAML 1.2's core-schema numbers (decimal, 0o octal, 0x hex; floats with or without a dot, so
# 3e-4 is a number), with `_` between digits allowed as in TOML and Python. PyYAML matches them with
# re.match, so each ends in \Z: `$` would also match before a final newline.
_INT = re.compile(r"(?:[-+]?[0-9][0-9_]*|0o[0-7_]+|0x[0-9a-fA-F_]+)\Z")
_FLOAT = re.compile(r"(?:[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z")
_REPLACED = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp")
_MERGE = "tag:yaml.org,2002:merge"
_SIMPLER = "write each setting as `key: value`, its value a plain value or a short list or mapping of them."


def _int(text: str) -> int:
    """Decimal unless it says 0o or 0x: `010` is ten (YAML 1.1 read it as octal 8)."""
    digits = text.replace("_", "")
    return int(digits, 0) if digits[:2] in ("0o", "0x") else int(digits, 10)


def _float(text: str) -> float:
    lowered = text.replace("_", "").lower()
    return float(lowered.replace(".inf", "inf").replace(".nan", "nan"))


def _at(mark: yaml.Mark | None) -> str:
    assert mark is not None  # PyYAML's scanner marks every event and node it makes
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _too_long(digits: str, where: str = "") -> ConfigError:
    return ConfigError(f"holds an integer of {digits} digits{where}; no setting takes more than {MAX_DIGITS}.",
                       "write a smaller number, or quote it if it is text.")


def _too_many() -> ConfigError:
    return ConfigError(f"holds more than {MAX_VALUES} values (an alias *name counts as all the values it "
                       "repeats); a settings file holds a few dozen.", "write the values out instead of "
                       "repeating lists by aliases, and check that the path names a settings file.")


@functools.cache
def _loader() -> type[yaml.SafeLoader]:
    """PyYAML's SafeLoader with YAML 1.2's numbers and no dates. PyYAML implements YAML 1.1, where
    `seed: 010` is octal 8, `lr: 3e-4` is a string (1.1 floats need a dot), `name: 2024-01-01` is a
    date and `time: 1:00:00` is the base-60 integer 3600, which Slurm would read as 3600 minutes.
    Here those are 10, 0.0003, the text 2024-01-01 and the Slurm time written. It refuses, as TOML
    does, a key given twice (PyYAML keeps the last silently), and nesting past MAX_DEPTH (PyYAML's
    composer recurses once per level). Built on first use: most commands read no file, and importing
    yaml is a good part of their start-up."""
    import yaml

    class Loader(yaml.SafeLoader):
        depth = nodes = 0

        def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
            self.depth, self.nodes = self.depth + 1, self.nodes + 1
            try:
                if self.depth > MAX_DEPTH + 1:  # a plain value is one level below its list (as in _check_bounds)
                    event = self.peek_event()  # type: ignore[no-untyped-call]
                    raise ConfigError(f"nests lists or mappings more than {MAX_DEPTH} deep "
                                      f"({_at(event.start_mark)}).", _SIMPLER)
                if self.nodes > MAX_VALUES:  # early: PyYAML composes some 10,000 values a second
                    raise _too_many()
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: dict[object, yaml.Node] = {}
            for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
                key = None if key_node.tag == _MERGE else self.construct_object(key_node, deep=True)
                if isinstance(key, Hashable) and key is not None:
                    if key in seen:
                        raise ConfigError(f"gives the key {shown(key)} twice ({_at(seen[key].start_mark)} and "
                                          f"{_at(key_node.start_mark)}).", "keep one of them: YAML would keep "
                                          "only the last silently, and TOML refuses it too.")
                    seen[key] = key_node
            return super().construct_mapping(node, deep=deep)

    Loader.yaml_implicit_resolvers = {  # copies: SafeLoader's own stay as they are
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _REPLACED]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))

    def number(read: Callable[[str], int | float]) -> Callable[[yaml.SafeLoader, yaml.Node], int | float]:
        def construct(loader: yaml.SafeLoader, node: yaml.Node) -> int | float:
            assert isinstance(node, yaml.ScalarNode)  # the resolvers above tag scalars only
            text = str(loader.construct_scalar(node))
            digits = sum(c.isalnum() for c in text.removeprefix("0x").removeprefix("0o"))
            if read is _int and digits > MAX_DIGITS:
                raise _too_long(str(digits), f" ({_at(node.start_mark)})")
            return read(text)
        return construct

    Loader.add_constructor("tag:yaml.org,2002:int", number(_int))
    Loader.add_constructor("tag:yaml.org,2002:float", number(_float))
    return Loader


def _children(value: object) -> list[object]:
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    return list(value) if isinstance(value, list | tuple | set | frozenset) else []


def _check_bounds(data: object) -> None:
    """Refuse data that is larger once expanded than MAX_VALUES, deeper than MAX_DEPTH, refers to
    itself, or holds an integer of more than MAX_DIGITS digits. YAML aliases share one object, so
    the walk visits each object once and adds up the sizes the aliases stand for (without the memo
    an alias bomb would take as long to check as to expand). Iterative: no recursion to overflow."""
    sizes: dict[int, tuple[int, int]] = {}  # id -> (values once expanded, depth)
    visiting: set[int] = set()  # started; those not yet in sizes contain the value being visited
    stack: list[tuple[object, bool]] = [(data, False)]
    while stack:
        value, done = stack.pop()
        if isinstance(value, int) and value.bit_length() > MAX_DIGITS * 3.33:
            raise _too_long(f"about {int(value.bit_length() * 0.30103) + 1}")
        children, key = _children(value), id(value)
        if not isinstance(value, dict | list | tuple | set | frozenset) or key in sizes:
            continue
        if done:
            inner = [sizes.get(id(c), (1, 0)) for c in children]
            sizes[key] = (1 + sum(n for n, _ in inner), 1 + max((d for _, d in inner), default=0))
            if sizes[key][0] > MAX_VALUES:
                raise _too_many()
            if sizes[key][1] > MAX_DEPTH:
                raise ConfigError(f"nests lists or mappings more than {MAX_DEPTH} deep.", _SIMPLER)
            continue
        if key in visiting:
            raise ConfigError("holds a list or mapping that contains itself (an alias *name inside its own "
                              "&name).", "an alias may only repeat a value that is complete before it.")
        visiting.add(key)
        stack.append((value, True))
        stack.extend((child, False) for child in children)


def load_yaml(text: str, source: str = "the YAML text") -> Any:
    """yaml.safe_load with YAML 1.2's numbers and no dates (see _loader): `3e-4` and `010` are the
    numbers they look like, `2024-01-01` and `1:00:00` stay text. Bounded as the module says;
    `source` names the text in a ConfigError ("job spec x.yaml", "the value of lr")."""
    import yaml

    try:
        data = yaml.load(text, Loader=_loader())  # a SafeLoader: no arbitrary objects
        _check_bounds(data)
    except ConfigError as exc:
        raise ConfigError(f"{source} {exc.message}", exc.hint) from None
    return data


def read_text(path: Path, label: str) -> str:
    """The UTF-8 text of a settings file, at most MAX_FILE_BYTES of it (a path to /dev/zero or a huge
    file is refused, not read until memory runs out). `label` names the file in errors."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {label}: {exc.strerror or exc}.", "check the path.") from exc
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{label} is larger than {MAX_FILE_BYTES >> 10} KiB; a settings file is a few lines "
                          "of YAML or TOML.", "check the path: it should name a YAML or TOML settings file.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{label} is not UTF-8 text: byte {data[exc.start]:#04x} at line {line} is not part "
                          "of a UTF-8 character.", "save the file as UTF-8 (or check that the path names a "
                          "YAML or TOML settings file).") from None


def _load_toml(text: str, label: str) -> Any:
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{label} is not valid toml: {exc}.", "fix the syntax at the position shown.") from None
    except RecursionError:  # tomllib recurses once per level of nesting
        raise ConfigError(f"{label} nests arrays or tables more than {MAX_DEPTH} deep.", _SIMPLER) from None
    except ValueError:  # int() past its limit of digits
        too_long = _too_long("more than 4300")
        raise ConfigError(f"{label} {too_long.message}", too_long.hint) from None
    try:
        _check_bounds(data)
    except ConfigError as exc:
        raise ConfigError(f"{label} {exc.message}", exc.hint) from None
    return data


def read_mapping(path: Path, label: str, valid_keys: Iterable[str]) -> dict[str, Any]:
    """The file's top-level mapping with `-` in keys turned into `_`; `label` names it in errors."""
    text = read_text(path, label)
    import yaml

    suffix = Path(path).suffix
    try:
        raw = _load_toml(text, label) if suffix == ".toml" else load_yaml(text, label)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{label} is not valid {suffix[1:] or 'YAML'}: {exc}.",
                          "fix the syntax at the position shown.") from exc
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{label} holds a {type(raw).__name__}, expected a mapping.",
                          f"write `key: value` lines; valid keys: {', '.join(valid_keys)}.")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name in out:  # `tasks-per-node: 2` and `tasks_per_node: 4`
            raise ConfigError(f"{label} gives {shown(name)} twice (spelled with `-` and with `_`).",
                              "keep one of them.")
        out[name] = value
    return out


def unknown_keys_error(source: str, unknown: Sequence[str], valid: Sequence[str]) -> ConfigError:
    """The error for keys a spec or config does not have, with the closest valid key for each typo
    (the first 20 of them: a file may hold thousands)."""
    named = [shown(key)[1:-1] for key in unknown[:20]] + ([f"and {len(unknown) - 20} more"] if unknown[20:] else [])
    guesses = [f"{shown(key)[1:-1]} -> {close[0]}" for key in unknown[:20]
               if (close := difflib.get_close_matches(key.lstrip("_")[:100], valid, n=1, cutoff=0.7))]
    did_you_mean = f"did you mean {', '.join(guesses)}? " if guesses else ""
    if any(key.startswith("__") for key in unknown):  # `--tasks-per-node: 2`: a flag's spelling in a file
        did_you_mean += "a file's keys have no leading -- (tasks_per_node: 2 or tasks-per-node: 2); "
    return ConfigError(f"unknown key(s) in {source}: {', '.join(named)}.",
                       f"{did_you_mean}valid keys are {', '.join(valid)}.")
