"""The layout's rules, checked on the source: imports go down the tiers that docs/architecture.md
states, no import cycle exists (imports under TYPE_CHECKING and inside functions count), no module
passes 400 lines, and every module with logic has its tests where the tree says they are."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SRC = ROOT / "src"
PACKAGE = SRC / "torchslurm"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MAX_LINES = 400

# Modules whose tests are not tests/unit/<family>/test_<module>.py, and where they are instead: each
# of these files must exist and name the module it tests.
TESTED_ELSEWHERE = {
    "torchslurm.errors": "tests/unit/cli/test_errors.py",
    "torchslurm.train.trainer": "tests/multiproc/test_trainer.py",
    "torchslurm.cli.bench": "tests/multiproc/test_doctor_bench.py",
    "torchslurm.cli.cancel": "tests/unit/cli/test_jobs_ux.py",
    "torchslurm.cli.logs": "tests/unit/cli/test_jobs_ux.py",
    "torchslurm.cli.status": "tests/unit/cli/test_jobs_ux.py",
    "torchslurm.cli.submit": "tests/unit/cli/test_jobs_ux.py",
    "torchslurm.cli.script": "tests/unit/cli/test_jobs_ux.py",
    "torchslurm.cli.run": "tests/unit/cli/test_run_ux.py",
    "torchslurm.cli.sandbox": "tests/cluster/test_sandbox.py",
    "torchslurm.lint.lines": "tests/unit/lint/test_parse.py",
    "torchslurm.lint.options": "tests/unit/lint/test_parse.py",
}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The module of ours that importing `name` names: `torchslurm.train.config.TrainConfig` ->
    `torchslurm.train.config`; None for other packages."""
    while name not in modules() and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in modules() else None


def _imported(name: str, tree: ast.AST, is_package: bool) -> Iterator[str]:
    here = name if is_package else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):  # every import: top level, in functions, under TYPE_CHECKING
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            yield from (f"{base}.{alias.name}" for alias in node.names)


@cache
def import_graph() -> dict[str, frozenset[str]]:
    """Module -> the modules of ours it imports (itself and other packages left out)."""
    graph = {}
    for name, path in modules().items():
        found = {_resolve(target) for target in _imported(name, ast.parse(path.read_text()), path.name == "__init__.py")
                 if target.split(".")[0] == "torchslurm"}
        graph[name] = frozenset(found - {None, name})  # type: ignore[operator]
    return graph


def part_of(module: str) -> str:
    """The family (a folder under torchslurm/) or top-level module a module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "torchslurm"


@cache
def tiers() -> dict[str, int]:
    """docs/architecture.md's sentence "**Imports go down only** …: `a` → `b`, `c` → …": each part of
    the package named in backticks, with its tier (0 at the top)."""
    sentence = re.search(r"\*\*Imports go down only\*\*[^:]*:(.*?)\.\s", ARCHITECTURE.read_text(), re.S)
    assert sentence, f"{ARCHITECTURE} has no '**Imports go down only**' sentence"
    return {name: tier for tier, names in enumerate(sentence.group(1).split("→"))
            for name in re.findall(r"`([\w.]+)`", names)}


def test_every_part_of_the_package_has_a_tier() -> None:
    parts = {part_of(name) for name in modules()}
    assert parts == set(tiers()), f"tiers in {ARCHITECTURE.name} differ from the package: add or remove these " \
        f"there: missing {sorted(parts - set(tiers()))}, gone {sorted(set(tiers()) - parts)}"


@dataclass(frozen=True)
class Edge:
    source: str
    target: str

    def __str__(self) -> str:
        return f"{self.source} imports {self.target}"


def upward_imports(graph: Mapping[str, frozenset[str]], tier: Mapping[str, int]) -> list[Edge]:
    """Imports between parts of the package that do not go to a lower tier. Parts of the lowest tier
    (the leaves) may import each other; the cycle test keeps them apart."""
    lowest = max(tier.values())
    return [Edge(source, target) for source, targets in graph.items() for target in sorted(targets)
            if part_of(source) != part_of(target)
            and not (tier[part_of(target)] > tier[part_of(source)]
                     or tier[part_of(target)] == tier[part_of(source)] == lowest)]


def cycles(graph: Mapping[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_imports_go_down_the_tiers() -> None:
    wrong = upward_imports(import_graph(), tiers())
    assert not wrong, "imports against the tiers of docs/architecture.md:\n" + "\n".join(map(str, wrong))


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_checks_catch_what_they_look_for() -> None:
    """The two rules on a made-up graph: an import up a tier, and a cycle through a type-only import."""
    tier = {"cli": 0, "train": 1, "runtime": 2, "errors": 3, "hostlist": 3}
    graph = {"torchslurm.runtime.a": frozenset({"torchslurm.train.b"}), "torchslurm.train.b": frozenset(),
             "torchslurm.errors": frozenset({"torchslurm.hostlist"}), "torchslurm.hostlist": frozenset()}
    assert upward_imports(graph, tier) == [Edge("torchslurm.runtime.a", "torchslurm.train.b")]
    graph["torchslurm.train.b"] = frozenset({"torchslurm.runtime.a"})
    assert cycles(graph) == [["torchslurm.runtime.a", "torchslurm.train.b"]]


def test_type_only_and_function_imports_are_counted(tmp_path: Path) -> None:
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from torchslurm.train.trainer import Trainer\n"
              "def f():\n    from . import data\n    import torchslurm.jobs.spec\n")
    found = set(_imported("torchslurm.train.resume", ast.parse(source), is_package=False))
    assert {"torchslurm.train.trainer.Trainer", "torchslurm.train.data", "torchslurm.jobs.spec"} <= found


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_is_short(name: str) -> None:
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{modules()[name]} has {lines} lines; split it by concept (at most {MAX_LINES})"


def _has_logic(path: Path) -> bool:
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
               for node in ast.parse(path.read_text()).body)


def unit_test_path(name: str) -> Path:
    *folders, last = name.split(".")[1:]
    return ROOT.joinpath("tests", "unit", *folders, f"test_{last}.py")


LOGIC_MODULES = sorted(name for name, path in modules().items()
                       if path.name not in ("__init__.py", "__main__.py") and _has_logic(path))


@pytest.mark.parametrize("name", LOGIC_MODULES)
def test_module_has_its_tests(name: str) -> None:
    if name not in TESTED_ELSEWHERE:
        path = unit_test_path(name)
        assert path.is_file(), f"{name} has logic but no {path.relative_to(ROOT)} (tests mirror the tree); " \
            "write it, or name where it is tested in TESTED_ELSEWHERE"
        return
    elsewhere = ROOT / TESTED_ELSEWHERE[name]
    assert elsewhere.is_file(), f"TESTED_ELSEWHERE names {elsewhere} for {name}; it does not exist"
    assert name.rsplit(".", 1)[-1] in elsewhere.read_text(), f"{elsewhere} does not use {name}"


def test_tested_elsewhere_names_only_modules_without_their_own_file() -> None:
    stale = [name for name in TESTED_ELSEWHERE if name not in modules() or unit_test_path(name).is_file()]
    assert not stale, f"TESTED_ELSEWHERE entries with their own test file now, or gone: {stale}"


def documented_modules() -> dict[str, set[str]]:
    """The tree of docs/architecture.md: family (or family/subpackage) -> the modules it lists."""
    tree = ARCHITECTURE.read_text().split("```")[1]
    found: dict[str, set[str]] = {}
    family = sub = ""
    for line in tree.splitlines():
        m = re.match(r"^( {2,6})([a-z_][\w, ]*?)(/)?(?: {2,}|$)", line)
        if not m:
            continue
        depth, names = len(m.group(1)), [n.strip() for n in m.group(2).split(",")]
        if depth == 2 and m.group(3):
            family, sub = names[0], ""
        elif depth == 4 and m.group(3):
            sub = names[0]
            found.setdefault(family, set()).add(sub)
        elif depth == 4:
            sub = ""
            found.setdefault(family, set()).update(names)
        elif depth == 6 and sub:
            found.setdefault(f"{family}/{sub}", set()).update(names)
    return found


def test_the_architecture_page_lists_every_module_of_every_family() -> None:
    on_disk: dict[str, set[str]] = {}
    for name in modules():
        parts = name.split(".")[1:]
        if len(parts) >= 2:  # a module of a family; a subpackage (its __init__) is listed in its family too
            on_disk.setdefault("/".join(parts[:-1]), set()).add(parts[-1])
    on_disk.pop("cli")  # one module per subcommand, as the page says
    documented = documented_modules()
    assert documented == on_disk, {key: (sorted(documented.get(key, set()) - on_disk.get(key, set())),
                                         sorted(on_disk.get(key, set()) - documented.get(key, set())))
                                   for key in {*documented, *on_disk} if documented.get(key) != on_disk.get(key)}
