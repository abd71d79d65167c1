"""Rank 0 shows a tqdm bar when stdout is a terminal and plain log lines when it is not (Slurm logs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiproc

EXAMPLE = Path(__file__).parents[2] / "examples" / "simple_model.py"


def train(run_dir: Path, stdout: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(EXAMPLE), "epochs=1", f"run_dir={run_dir}", "resume=never"],
                            stdout=stdout, stderr=subprocess.PIPE, cwd=run_dir.parent)


def read_until_closed(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def test_terminal_gets_a_progress_bar(tmp_path: Path) -> None:
    controller, terminal = os.openpty()
    proc = train(tmp_path / "tty", stdout=terminal)
    os.close(terminal)
    out = read_until_closed(controller).decode(errors="replace")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert "final validation accuracy" in out
    assert "batch/s]" in err.decode() and "epoch 1 batch 50/52" not in err.decode()


def test_a_log_file_gets_plain_lines(tmp_path: Path) -> None:
    proc = train(tmp_path / "file", stdout=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"final validation accuracy" in out
    assert "epoch 1 batch 50/52 step 50: loss" in err.decode() and "batch/s]" not in err.decode()
