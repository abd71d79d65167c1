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


_MASTER_HINT = ("remove it: torchslurm.init() derives the port from SLURM_JOB_ID; or derive it from the job id: "
                "port=$((10000 + SLURM_JOB_ID * 8 % 22768)), or use `torchslurm script --launch torchrun`")


@pytest.mark.parametrize(("directives", "why"), [
    ("--exclusive", "the job holds whole nodes (--exclusive)"),
    ("--mem=0", "the job holds whole nodes (--mem=0 (all of each node's memory))"),
    ("--mem=0G", "the job holds whole nodes (--mem=0G (all of each node's memory))"),
    ("--mem=0g", "the job holds whole nodes (--mem=0g (all of each node's memory))"),
    ("--mem=0M", "the job holds whole nodes (--mem=0M (all of each node's memory))"),
    ("--gpus-per-node=8", "the job holds all 8 GPUs of each node"),
])
def test_a_fixed_port_on_whole_nodes_is_info_saying_why_it_is_safe(directives: str, why: str) -> None:
    text = f"#!/bin/bash\n#SBATCH --nodes=1 {directives}\nexport MASTER_PORT=29500\nsrun -K python t.py &\nwait\n"
    (found,) = [f for f in lint(text) if f.code == "fixed-master-port"]
    assert (found.severity, found.message, found.hint) == (
        "info", f"line 3: MASTER_PORT=29500 is fixed; safe here: {why}, so no other job binds it there.",
        f"to run on shared nodes too, {_MASTER_HINT}.")


@pytest.mark.parametrize(("directives", "why"), [
    ("--mem=10G", "the job does not hold whole nodes (no --exclusive), so where the cluster shares nodes another "
                  "job can bind it there"),
    ("--gpus-per-node=4", "4 GPUs per node without --exclusive, so on nodes with more GPUs another job can share the "
                          "node"),
])
def test_a_fixed_port_on_part_of_a_node_is_a_warning_saying_who_could_bind_it(directives: str, why: str) -> None:
    text = f"#!/bin/bash\n#SBATCH --nodes=1 {directives}\nexport MASTER_PORT=29500\nsrun -K python t.py\n"
    (found,) = [f for f in lint(text) if f.code == "fixed-master-port"]
    assert (found.severity, found.message, found.hint) == (
        "warning", f"line 3: MASTER_PORT=29500 is fixed: {why}; the second one to bind it gets EADDRINUSE or joins "
                   "this job's rendezvous.", f"{_MASTER_HINT}, or #SBATCH --exclusive.")


def test_two_steps_at_once_on_one_fixed_port_say_so() -> None:
    text = ("#!/bin/bash\n#SBATCH --nodes=1 --exclusive\nexport MASTER_PORT=29500\nsrun -K python t.py &\n"
            "srun -K python e.py &\nwait\n")
    (found,) = [f for f in lint(text) if f.code == "fixed-master-port"]
    assert found.message == ("line 3: MASTER_PORT=29500 is fixed: two steps of this job run at the same time (`srun "
                             "... &`) and both bind it; the second one to bind it gets EADDRINUSE or joins this job's "
                             "rendezvous.")


@pytest.mark.parametrize(("endpoint", "default"), [
    ("", "no --master-port: its default, 29500"),  # one node: torchrun holds the rendezvous on its port
    (" --rdzv-backend=c10d --rdzv-endpoint=[::1]", "--rdzv-endpoint=[::1] without a port: its default, 29400"),
    (" --rdzv-backend=c10d --rdzv-endpoint=h:", "--rdzv-endpoint=h: without a port: its default, 29400"),
    (" --rdzv-backend=c10d --rdzv-endpoint=h", "--rdzv-endpoint=h without a port: its default, 29400"),
    (" --rdzv-backend=c10d --rdzv-endpoint=[::1]:$port", None),
    (" --rdzv-backend=c10d --rdzv-endpoint=$head:$port", None),
])
def test_torchrun_on_one_node_without_a_port_binds_its_default(endpoint: str, default: str | None) -> None:
    text = f"#!/bin/bash\n#SBATCH --nodes=1\nsrun -K torchrun --nproc-per-node=4{endpoint} t.py\n"
    found = [f.message for f in lint(text) if f.code == "fixed-port"]
    assert found == ([f"line 3: torchrun's rendezvous port ({default}) is fixed: the job does not hold whole nodes "
                      "(no --exclusive), so where the cluster shares nodes another job can bind it there; the second "
                      "one to bind it gets EADDRINUSE or joins this job's rendezvous."] if default else [])
