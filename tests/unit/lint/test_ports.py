"""lint rules of fixed ports (lint/ports.py), judged by how the node is shared."""

from __future__ import annotations

import pytest

from torchslurm.lint.report import lint


def _only(text: str, code: str) -> list[str]:
    return [str(f) for f in lint(text) if f.code == code]


@pytest.mark.parametrize(("launch", "flagged"), [
    ("srun -K torchrun --standalone --nproc-per-node=4 --master_port=29500 t.py", False),  # ignored: standalone
    ("torchrun --nproc-per-node=4 --master-port 29400 t.py", True),
    ("torchrun --nproc-per-node=4 --master-port=$((10000 + SLURM_JOB_ID % 20000)) t.py", False),
])


def test_fixed_master_port_on_the_launcher(launch: str, flagged: bool) -> None:
    text = "#!/bin/bash\n#SBATCH --ntasks-per-node=1 --gpus-per-node=4\n" + launch + "\n"
    assert bool(_only(text, "fixed-master-port")) is flagged

