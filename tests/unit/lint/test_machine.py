"""lint rules that ask the machine lint runs on (lint/machine.py): the log folder, bash -n."""

from __future__ import annotations

from torchslurm.lint.report import lint


def test_log_dir_checked_with_path_exists() -> None:
    text = "#!/bin/bash\n#SBATCH --output=logs/%j.out\nsrun python t.py\n"
    assert [f.code for f in lint(text, path_exists=lambda p: p != "logs")] == ["log-dir"]
    assert lint(text, path_exists=lambda p: True) == []

