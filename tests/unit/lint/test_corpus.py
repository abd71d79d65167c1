"""lint over a corpus of sbatch scripts shaped like real public ones (tests/fixtures/lint_corpus/).

Each script says its verdict in a header comment: `# expect: clean` (a correct script: no error
allowed), `# expect: warning RULE` (it may work, depending on the cluster: RULE warns, no error) or
`# expect: error RULE` (a real defect that RULE must flag). bash itself (`bash -n`) reads every script,
as `torchslurm lint` does. Every line of every script, here and in tests/fixtures/real_failures/, is
read by lint or reported as unread.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from torchslurm.cli.lint import bash_syntax
from torchslurm.jobs.findings import Finding
from torchslurm.lint.parse import parse
from torchslurm.lint.report import lint

FIXTURES = Path(__file__).parents[2] / "fixtures"
CORPUS = FIXTURES / "lint_corpus"
SCRIPTS = sorted(CORPUS.glob("*.sbatch"))
EVERY_SCRIPT = SCRIPTS + sorted((FIXTURES / "real_failures").glob("**/*.sbatch"))
MAX_WARNINGS_PER_CORRECT_SCRIPT = 1.0


def _expected(path: Path) -> str:
    m = re.search(r"^# expect: (clean|(?:error|warning) [a-z-]+)$", path.read_text(), re.MULTILINE)
    assert m, f"{path.name} has no `# expect:` line"
    return m.group(1)


def _lint(path: Path) -> list[Finding]:
    return lint(path.read_text(), syntax=bash_syntax if shutil.which("bash") else None)


CORRECT = [p for p in SCRIPTS if _expected(p) == "clean" or _expected(p).startswith("warning")]
BUGGY = [p for p in SCRIPTS if _expected(p).startswith("error")]
WARNED = [p for p in SCRIPTS if _expected(p).startswith("warning")]


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


@pytest.mark.parametrize("path", WARNED, ids=lambda p: p.stem)
def test_script_that_depends_on_the_cluster_is_warned_by_its_rule(path: Path) -> None:
    rule = _expected(path).split()[1]
    assert rule in {f.code for f in _lint(path) if f.severity == "warning"}


def _commands(text: str) -> set[int]:
    """The physical lines that hold more than blanks and a comment."""
    return {n for n, line in enumerate(text.splitlines(), 1) if line.strip() and not line.strip().startswith("#")}


@pytest.mark.parametrize("path", EVERY_SCRIPT, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_line_is_read_or_reported(path: Path) -> None:
    text = path.read_text()
    script = parse(text)
    read = {n for first, last in script.read for n in range(first, last + 1)}
    reported = {n for u in script.unclosed for n in range(u.line, len(text.splitlines()) + 1)}
    assert _commands(text) <= read | reported
    assert not reported or "unread-lines" in {f.code for f in lint(text)}


@pytest.mark.parametrize("path", EVERY_SCRIPT, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_line_of_a_script_bash_reads_is_read(path: Path) -> None:
    """Where bash parses a script, lint reads all of it: nothing left unread."""
    if shutil.which("bash") is None or bash_syntax(path.read_text()) is not None:
        pytest.skip("bash is not installed, or it refuses this script")
    assert parse(path.read_text()).unclosed == []


def test_warnings_per_correct_script_stay_low() -> None:
    warnings = sum(1 for p in CORRECT for f in _lint(p) if f.severity == "warning")
    assert warnings / len(CORRECT) <= MAX_WARNINGS_PER_CORRECT_SCRIPT, warnings


def test_every_correct_script_parses_in_bash() -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    assert [p.name for p in CORRECT if bash_syntax(p.read_text()) is not None] == []
