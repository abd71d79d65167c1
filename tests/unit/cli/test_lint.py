"""`torchslurm lint`: scripts it cannot read, standard input, output and exit status."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from torchslurm.cli import main
from torchslurm.cli.lint import MAX_SCRIPT_BYTES

FIXTURES = Path(__file__).parents[2] / "fixtures"
TORCHRUN = FIXTURES / "lint_torchrun"


def test_cli_reports_unreadable_scripts_and_lints_the_rest(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin.sbatch").write_bytes(b"\x00\x01\xff\xfe binary")
    (tmp_path / "good.sbatch").write_text("#!/bin/bash\n#SBATCH -N 1\nsrun python t.py\n")
    (tmp_path / "dir").mkdir()
    assert main(["lint", "bin.sbatch", "dir", "good.sbatch", "missing.sbatch"]) == 2
    out, err = capsys.readouterr()
    assert out == "good.sbatch: ok\n"
    assert err.splitlines() == [
        "error: bin.sbatch is not a text file (a NUL byte at offset 0). "
        "HINT: pass the sbatch script itself, e.g. torchslurm lint job.sbatch.",
        "error: cannot read dir: Is a directory. HINT: pass the script files in it, e.g. torchslurm lint dir/*.sbatch.",
        f"error: cannot read missing.sbatch: No such file or directory. HINT: check the path (a relative path starts "
        f"at {tmp_path}).",
    ]


def test_cli_lints_a_script_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "latin1.sbatch"
    script.write_bytes(b"#!/bin/bash\n# caf\xe9\n#SBATCH --ntasks=4\npython t.py\n")  # sbatch accepts it
    assert main(["lint", str(script)]) == 1
    assert "error: [python-without-srun] line 4:" in capsys.readouterr().out


def test_cli_reads_the_script_from_stdin_for_a_dash(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-").write_text("#!/bin/bash\n#SBATCH -N 1\nsrun python t.py\n")  # ./- is the file named -
    stdin = io.TextIOWrapper(io.BytesIO((TORCHRUN / "no_rendezvous.sbatch").read_bytes()))
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["lint", "-", "./-"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("<stdin>: error: [torchrun-no-rendezvous] line 4: torchrun --nnodes=2 without")
    assert out[-1] == "-: ok"



def test_cli_refuses_a_fifo_a_device_and_a_script_past_sbatchs_size_without_reading_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO nobody writes blocked lint forever; a link to /dev/zero was read until memory ran out."""
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "fifo.sbatch")
    (tmp_path / "zero.sbatch").symlink_to("/dev/zero")
    (tmp_path / "big.sbatch").write_text("#!/bin/bash\n" + "#" * MAX_SCRIPT_BYTES + "\n")
    (tmp_path / "good.sbatch").write_text("#!/bin/bash\n#SBATCH -N 1\nsrun -K python t.py\n")
    assert main(["lint", "fifo.sbatch", "zero.sbatch", "big.sbatch", "good.sbatch"]) == 2
    out, err = capsys.readouterr()
    hint = ("HINT: pass the sbatch script itself; to lint what a command writes, pipe it in: "
            "COMMAND | torchslurm lint -.")
    assert (out, err.splitlines()) == ("good.sbatch: ok\n", [
        f"error: fifo.sbatch is a named pipe (FIFO), not a regular file: lint reads script files. {hint}",
        f"error: zero.sbatch is a character device, not a regular file: lint reads script files. {hint}",
        "error: big.sbatch is larger than 4 MiB, which sbatch refuses by default (SchedulerParameters="
        "max_script_size). HINT: pass the sbatch script itself; keep data out of it (read it from a file the script "
        "names).",
    ])


def test_cli_reads_at_most_sbatchs_size_from_stdin(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"#" * (2 * MAX_SCRIPT_BYTES))))
    assert main(["lint", "-"]) == 2
    assert capsys.readouterr().err.startswith("error: <stdin> is larger than 4 MiB, which sbatch refuses")
