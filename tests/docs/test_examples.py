"""Every shell and Python block of README.md and docs/*.md runs as written; `console` blocks
(`$ command` then its output, `...` for the parts that change) are checked against the real
output. A block whose first line is `# illustrative: why` is skipped on purpose (it needs a GPU
cluster, root, or minutes of CPU), and must say why.

Sybil finds the blocks; each page runs in one fresh folder, blocks in order, so a `yaml` block
whose first line names a file (`# job.yaml ...`) is written there for the shell blocks after it; so
is a `python` block whose first line names a file (`# train.py ...`): saved, not run, for the blocks
after it to run (`python train.py`) or import.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ILLUSTRATIVE = re.compile(r"^# illustrative: \S")
FILE_NAME = re.compile(r"^# ([\w.-]+\.(?:yaml|yml|toml))\b")
PYTHON_FILE = re.compile(r"^# ([\w-]+\.py)\b")
TIMEOUT_S = 120


def _environ(cwd: Path) -> dict[str, str]:
    """This checkout's venv first on PATH, Slurm pointed nowhere, quiet terminals."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["HOME"] = str(cwd)
    return env


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=_environ(cwd), capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False, stdin=subprocess.DEVNULL)


def _illustrative(code: str) -> bool:
    first = code.lstrip("\n").split("\n", 1)[0]
    if first.startswith("# illustrative"):
        assert ILLUSTRATIVE.match(first), f"an illustrative block says why: {first!r}"
        return True
    return False


def _cwd(example: Example) -> Path:
    return Path(example.namespace["cwd"])


def run_shell(example: Example) -> None:
    code = str(example.parsed)
    if _illustrative(code):
        return
    done = _run(["bash", "-euo", "pipefail", "-c", code], _cwd(example))
    assert done.returncode == 0, f"{example.path}:{example.line} exited {done.returncode}:\n{done.stdout}{done.stderr}"


def run_python(example: Example) -> None:
    code = str(example.parsed)
    if _illustrative(code):
        return
    if named := PYTHON_FILE.match(code):
        (_cwd(example) / named.group(1)).write_text(code)
        return
    script = _cwd(example) / f"block_{example.line}.py"
    script.write_text(code)
    done = _run([sys.executable, str(script)], _cwd(example))
    assert done.returncode == 0, f"{example.path}:{example.line} exited {done.returncode}:\n{done.stdout}{done.stderr}"


def save_file(example: Example) -> None:
    code = str(example.parsed)
    if named := FILE_NAME.match(code):
        (_cwd(example) / named.group(1)).write_text(code)


def check_console(example: Example) -> None:
    """`$ cmd` lines run in order; the lines after each are its expected output (`...` matches anything)."""
    for command, expected in _sessions(str(example.parsed)):
        done = _run(["bash", "-c", command], _cwd(example))
        pattern = ".*".join(re.escape(part) for part in expected.split("...")) if expected else ""
        assert re.fullmatch(pattern, done.stdout.strip(), re.S), (
            f"{example.path}:{example.line} `{command}` printed:\n{done.stdout}{done.stderr}\nexpected:\n{expected}")


def _sessions(text: str) -> Iterator[tuple[str, str]]:
    for chunk in re.split(r"^\$ ", text.strip(), flags=re.M)[1:]:
        command, _, output = chunk.partition("\n")
        yield command, output.strip()


DOCS = Sybil(parsers=[CodeBlockParser("bash", run_shell), CodeBlockParser("python", run_python),
                      CodeBlockParser("yaml", save_file), CodeBlockParser("console", check_console)])


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_the_examples_of_a_page_run_as_written(page: Path, tmp_path: Path) -> None:
    document = DOCS.parse(page)
    document.namespace["cwd"] = str(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # pages name the examples by their repo path
    examples = list(document.examples())
    for example in examples:
        example.evaluate()


def test_every_page_with_code_has_its_blocks_collected() -> None:
    """A block in a language nothing runs would be neither run nor marked: only these are allowed."""
    fences = re.compile(r"^```(\w*)", re.M)
    for page in PAGES:
        languages = set(fences.findall(page.read_text())) - {""}
        assert languages <= {"bash", "python", "yaml", "console", "text", "mermaid", "toml"}, (page, languages)


def test_the_readme_is_a_front_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
