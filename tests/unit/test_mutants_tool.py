"""tools/mutants.py, the driver of `make mutants`: its shards name real modules and tests, its list of
equivalent mutants belongs to them, and its table counts mutmut's verdicts right."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutants_tool", ROOT / "tools" / "mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_every_shard_names_existing_modules_and_tests_and_no_module_is_in_two(tool: ModuleType) -> None:
    seen: list[str] = []
    for shard in tool.SHARDS.values():
        assert all((ROOT / "src" / "torchslurm" / f"{module}.py").is_file() for module in shard.modules), shard
        assert all((ROOT / test).exists() for test in shard.tests), shard
        seen += shard.modules
    assert len(seen) == len(set(seen))


def test_every_equivalent_mutant_is_of_a_module_of_its_shard(tool: ModuleType) -> None:
    tables = tomllib.loads(tool.EQUIVALENT.read_text())
    for shard, entries in tables.items():
        modules = {"torchslurm." + module.replace("/", ".") for module in tool.SHARDS[shard].modules}
        assert {tool.module_of(name) for name in entries} <= modules, shard
        assert all(len(why) > 20 for why in entries.values()), "each says why"


def test_the_table_counts_each_verdict_once_per_module(tool: ModuleType) -> None:
    text = "\n".join([
        "    torchslurm.hostlist.x_expand__mutmut_1: killed",
        "    torchslurm.hostlist.x_expand__mutmut_2: survived",
        "    torchslurm.hostlist.x_expand__mutmut_3: survived",
        "    torchslurm.hostlist.x_expand__mutmut_4: timeout",
        "    torchslurm.runtime.ports.xǁPortsǁpick__mutmut_1: no tests",
        "    torchslurm.runtime.ports.x_derived_port__mutmut_9: killed",
        "Some other line: killed",
    ])
    found = tool.parse_results(text)
    assert len(found) == 6
    rows = tool.table(found, {"torchslurm.hostlist.x_expand__mutmut_3": "why"})
    assert [(r.module, r.mutants, r.caught, r.survived, r.equivalent, r.other) for r in rows] == [
        ("torchslurm.hostlist", 4, 2, 1, 1, 0), ("torchslurm.runtime.ports", 2, 1, 0, 0, 1), ("all", 6, 3, 1, 1, 1)]
    assert [round(r.score, 1) for r in rows] == [66.7, 50.0, 60.0]
    assert "| torchslurm.hostlist | 4 | 2 | 1 | 1 | 0 | 66.7 % |" in tool.render(rows)


def test_a_shards_pyproject_is_the_repositorys_with_its_modules_and_tests(tool: ModuleType) -> None:
    text = (ROOT / "pyproject.toml").read_text()
    written = tomllib.loads(tool.shard_pyproject(text, tool.SHARDS["checkpoint"]))
    original = tomllib.loads(text)
    settings = written["tool"]["mutmut"]
    assert settings["only_mutate"] == ["src/torchslurm/train/checkpoint/layout.py",
                                       "src/torchslurm/train/checkpoint/integrity.py"]
    assert settings["pytest_add_cli_args_test_selection"] == list(tool.SHARDS["checkpoint"].tests)
    assert settings["process_isolation"] == "forkserver"
    assert {k: settings[k] for k in original["tool"]["mutmut"]} == original["tool"]["mutmut"]
    assert written["tool"]["pytest"] == original["tool"]["pytest"] and written["project"] == original["project"]
