"""lint over a corpus of sbatch scripts shaped like real public ones (tests/fixtures/lint_corpus/).

Each script says its verdict in a header comment: `# expect: clean` (a correct script: no error
allowed) or `# expect: error RULE` (a real defect that RULE must flag). bash itself (`bash -n`)
reads every script, as `torchslurm lint` does.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from torchslurm.cli.lint import bash_syntax
from torchslurm.jobs.findings import Finding
from torchslurm.lint.report import lint

CORPUS = Path(__file__).parents[2] / "fixtures" / "lint_corpus"
SCRIPTS = sorted(CORPUS.glob("*.sbatch"))
MAX_WARNINGS_PER_CORRECT_SCRIPT = 1.0


def _expected(path: Path) -> str:
    m = re.search(r"^# expect: (clean|error [a-z-]+)$", path.read_text(), re.MULTILINE)
    assert m, f"{path.name} has no `# expect:` line"
    return m.group(1)


def _lint(path: Path) -> list[Finding]:
    return lint(path.read_text(), syntax=bash_syntax if shutil.which("bash") else None)


CORRECT = [p for p in SCRIPTS if _expected(p) == "clean"]
BUGGY = [p for p in SCRIPTS if _expected(p) != "clean"]


def test_corpus_size() -> None:
    assert len(CORRECT) >= 40 and len(BUGGY) >= 14


@pytest.mark.parametrize("path", CORRECT, ids=lambda p: p.stem)
def test_correct_script_has_no_error(path: Path) -> None:
    assert [str(f) for f in _lint(path) if f.severity == "error"] == []


@pytest.mark.parametrize("path", BUGGY, ids=lambda p: p.stem)
def test_buggy_script_is_flagged_by_its_rule(path: Path) -> None:
    if "bash-syntax" in _expected(path) and shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    rule = _expected(path).split()[1]
    assert rule in {f.code for f in _lint(path) if f.severity == "error"}


def test_warnings_per_correct_script_stay_low() -> None:
    warnings = sum(1 for p in CORRECT for f in _lint(p) if f.severity == "warning")
    assert warnings / len(CORRECT) <= MAX_WARNINGS_PER_CORRECT_SCRIPT, warnings


def test_every_correct_script_parses_in_bash() -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    assert [p.name for p in CORRECT if bash_syntax(p.read_text()) is not None] == []
