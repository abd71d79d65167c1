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



SHARED = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gres=gpu:2\n"


@pytest.mark.parametrize(("directives", "severity"), [
    ("--gres=gpu:2", "warning"),  # a partial node: whether others share it is the cluster's policy
    ("--gres=gpu:1", "warning"),
    ("--gres=gpu:2 --exclusive", "info"),
    ("--gpus-per-node=8", "info"),
])
def test_a_fixed_port_on_a_partial_node_is_a_warning_not_an_error(directives: str, severity: str) -> None:
    text = f"#!/bin/bash\n#SBATCH --ntasks=2 {directives}\nexport MASTER_PORT=29500\nsrun -K python t.py\n"
    assert [f.severity for f in lint(text) if f.code == "fixed-master-port"] == [severity]


def test_two_overlapping_steps_on_one_fixed_port_are_still_an_error() -> None:
    text = ("#!/bin/bash\n#SBATCH --ntasks=2 --gres=gpu:2\nexport MASTER_PORT=29500\n"
            "srun -K -n1 python a.py &\nsrun -K -n1 python b.py\nwait\n")
    assert [f.severity for f in lint(text) if f.code == "fixed-master-port"] == ["error"]


@pytest.mark.parametrize(("launch", "port"), [
    ("torchrun --nproc-per-node=2 t.py", "29500"),  # one node, static: 127.0.0.1:29500
    ("python -m torch.distributed.run --nproc-per-node=2 t.py", "29500"),
    ("srun -K torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=$head t.py", "29400"),
    ("srun -K torchrun --nnodes=2 --nproc-per-node=2 --master-addr=$head --node-rank=$N t.py", "29500"),
])
def test_torchrun_given_no_port_binds_its_default_one(launch: str, port: str) -> None:
    (f,) = [f for f in lint(SHARED + launch + "\n") if f.code == "fixed-port"]
    assert f.severity == "warning" and f"its default, {port}) is fixed" in f.message
    assert f.hint.startswith("give it one per job: --master-port=$((")


@pytest.mark.parametrize("launch", [
    "torchrun --standalone --nproc-per-node=2 t.py",  # picks a free port itself
    "torchrun --nproc-per-node=2 --master-port=$port t.py",
    "torchrun --nproc-per-node=2 --rdzv-endpoint=localhost:0 t.py",  # port 0: the OS picks one
    "srun -K torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=$head:$port t.py",
    "srun -K torchrun --nnodes=2 --nproc-per-node=2 t.py",  # no rendezvous at all: torchrun-no-rendezvous's
])
def test_torchrun_with_a_port_per_job_or_none_to_bind_is_not_flagged(launch: str) -> None:
    assert "fixed-port" not in {f.code for f in lint(SHARED + launch + "\n")}
