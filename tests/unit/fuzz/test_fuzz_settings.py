"""Settings of any bytes: a job spec or training config file (YAML, JSON, TOML) and `key=value` overrides
load or are refused with a HINT; never a traceback, and never unbounded (aliases, nesting, digits)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.fuzz.conftest import FUZZ, answered

from torchslurm.configfile import load_yaml
from torchslurm.jobs import spec as jobspec
from torchslurm.train import config as trainconfig

KEYS = ["script", "nodes", "args", "env", "time", "mem", "array", "epochs", "lr", "run_dir", "seed", "resume",
        "tasks-per-node", "name", "x"]
PIECES = ["&a ", "*a", "[", "]", "{", "}", ": ", "\n", "- ", "'", '"', "9" * 120, "0x", "1e5", ".inf", "<<: ",
          "!!set ", "!!binary ", "? ", "#", ",", "=", " ", "\t", "\\", "\xe9", "٣", "null", "true", "~", "%YAML 1.2\n"]
YAMLISH = st.lists(st.sampled_from(KEYS) | st.sampled_from(PIECES) | st.text(max_size=5), max_size=40).map("".join)
RAW = YAMLISH.map(lambda s: s.encode("utf-8", "surrogatepass")) | st.binary(max_size=200)


@FUZZ
@given(YAMLISH)
def test_any_yaml_text_loads_or_is_refused(text: str) -> None:
    """load_yaml's syntax errors are yaml.YAMLError (the file readers say them with the file's name; a
    `key=value` that is not YAML is text); what is too large or deep is a ConfigError already."""
    with contextlib.suppress(yaml.YAMLError):
        answered(lambda: load_yaml(text))


@FUZZ
@given(RAW, st.sampled_from([".yaml", ".json", ".toml"]))
def test_any_spec_or_config_file_loads_or_is_refused(data: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"settings{suffix}"
        path.write_bytes(data)
        answered(lambda: jobspec.load(path))
        answered(lambda: trainconfig.load(path))


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(KEYS) | st.text(max_size=8), st.sampled_from(["=", "", "=="]), YAMLISH)
                .map("".join), max_size=4))
def test_any_key_value_overrides_load_or_are_refused(items: list[str]) -> None:
    answered(lambda: trainconfig.load(None, items))


@FUZZ
@given(st.dictionaries(st.sampled_from(KEYS[:7]) | st.text(max_size=6),
                       st.none() | st.booleans() | st.integers() | st.floats() | YAMLISH
                       | st.lists(YAMLISH, max_size=3) | st.dictionaries(YAMLISH, YAMLISH, max_size=2), max_size=6))
def test_any_spec_mapping_builds_or_is_refused(data: dict[str, object]) -> None:
    answered(lambda: jobspec.from_mapping(data))
