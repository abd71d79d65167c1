"""lint rules of how torchrun launchers of a multi-node step find each other (lint/rendezvous.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchslurm.lint.report import lint

FIXTURES = Path(__file__).parents[2] / "fixtures"

C10D = "--rdzv-backend=c10d --rdzv-endpoint=$h:$p"  # the rendezvous torchrun needs across nodes

TORCHRUN = FIXTURES / "lint_torchrun"
TORCHRUN_JOB = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=4\n"

STATIC = "torchrun --nnodes=2 --nproc-per-node=4 --master-addr=$head --master-port=$port"


def _only(text: str, code: str) -> list[str]:
    return [str(f) for f in lint(text) if f.code == code]


def test_torchrun_on_two_nodes_without_a_rendezvous_endpoint_hangs() -> None:
    (f,) = [f for f in lint((TORCHRUN / "no_rendezvous.sbatch").read_text()) if f.severity == "error"]
    assert (f.code, f.message) == ("torchrun-no-rendezvous",
                                   "line 4: torchrun --nnodes=2 without --rdzv-endpoint (or --master-addr): each "
                                   "node's launcher waits for the other nodes on its own localhost (127.0.0.1:29500), "
                                   "and the job hangs until the rendezvous times out.")
    assert f.hint.startswith('--rdzv-backend=c10d --rdzv-endpoint="$head:$port" --rdzv-id=$SLURM_JOB_ID')


@pytest.mark.parametrize(("launch", "flagged"), [
    ("srun -K torchrun --nnodes=$SLURM_NNODES --nproc-per-node=4 t.py", True),
    ("srun -K python -m torch.distributed.run --nnodes 2 --nproc-per-node=4 t.py", True),
    ("srun -K torchrun --nnodes=2 --nproc-per-node=4 t.py --rdzv-endpoint=x:1", True),  # the script's argument
    ("srun -K torchrun --nnodes=2 --nproc-per-node=4 --rdzv_endpoint=$head:$port t.py", False),
    ("srun -K torchrun --nnodes=2 --nproc-per-node=4 --rdzv-endpoint $head:$port t.py", False),
    ("srun -K torchrun --nnodes=2 --nproc-per-node=4 --master-addr=$head --node-rank=$SLURM_NODEID t.py", False),
    ("srun -K torchrun --nnodes=2 --nproc-per-node=4 --master-addr=$head --rdzv-backend=c10d t.py", True),
])


def test_torchrun_rendezvous_endpoint_read_from_its_own_options(launch: str, flagged: bool) -> None:
    assert bool(_only(TORCHRUN_JOB + launch + "\n", "torchrun-no-rendezvous")) is flagged


def test_torchrun_standalone_on_two_nodes_runs_two_separate_trainings() -> None:
    (f,) = lint((TORCHRUN / "standalone.sbatch").read_text())
    assert (f.severity, f.code, f.message) == (
        "error", "torchrun-standalone", "line 4: torchrun --standalone on each of the 2 nodes of the step: every "
        "node runs its own separate training with a rendezvous on localhost, i.e. 2 independent jobs writing the "
        "same checkpoints.")
    assert f.hint.startswith("replace --standalone with --rdzv-backend=c10d")


@pytest.mark.parametrize(("launch", "code"), [
    ("srun -K torchrun --standalone --nproc-per-node=4 t.py", "torchrun-standalone"),
    ("srun -K -N2 torchrun --standalone --nproc-per-node=4 t.py", "torchrun-standalone"),
    ("srun -K -N1 -n1 torchrun --standalone --nproc-per-node=4 t.py", None),  # a one-node step
    ("srun -K --ntasks=1 torchrun --standalone --nproc-per-node=4 t.py", None),
    ("srun -K torchrun --nproc-per-node=4 " + C10D + " t.py", "torchrun-nnodes"),
    ("srun -K torchrun --nnodes=1 --nproc-per-node=4 t.py", "torchrun-nnodes"),
    ("srun -K torchrun --nnodes=4 --nproc-per-node=4 " + C10D + " t.py", "torchrun-nnodes"),
    ("srun -K torchrun --nnodes=1:4 --nproc-per-node=4 " + C10D + " t.py", None),
    ("srun -K torchrun --nnodes=$SLURM_NNODES --nproc-per-node=4 " + C10D + " t.py", None),
])


def test_torchrun_that_does_not_span_the_step(launch: str, code: str | None) -> None:
    assert [f.code for f in lint(TORCHRUN_JOB + launch + "\n")] == ([code] if code else [])


def test_torchrun_without_nnodes_says_its_default() -> None:
    (f,) = lint(TORCHRUN_JOB + "srun -K torchrun --nproc-per-node=4 t.py\n")
    assert f.message == ("line 3: torchrun with no --nnodes (torchrun's default: 1), but srun starts it on 2 nodes: "
                         "every node runs its own separate training.")
    assert f.hint == "--nnodes=$SLURM_NNODES (one launcher per node of the step)."


def test_torchrun_master_addr_without_node_rank_on_two_nodes() -> None:
    found = lint((TORCHRUN / "no_node_rank.sbatch").read_text())
    assert [f.code for f in found] == ["torchrun-node-rank", "fixed-master-port"]
    rank, port = found
    assert rank.message == ("line 4: torchrun with the static rendezvous (--master-addr) on several nodes and no "
                            "--node-rank: every node takes node rank 0 (the default), so all claim the same ranks "
                            "and the job hangs or builds the wrong world.")
    assert rank.hint.startswith("--node-rank=$SLURM_NODEID, expanded by each task: export MASTER_ADDR=$(scontrol "
                                "show hostnames \"$SLURM_JOB_NODELIST\" | head -n1), then srun bash -c 'exec "
                                "torchrun --node-rank=$SLURM_NODEID --master-addr=$MASTER_ADDR ...'")
    assert "--rdzv-backend=c10d" in rank.hint
    assert (port.severity, port.message) == ("warning", "line 4: torchrun --master-port=29500 is fixed: 4 GPUs per "
                                             "node without --exclusive, so on nodes with more GPUs another job can "
                                             "share the node; the second one to bind it gets EADDRINUSE or joins this "
                                             "job's rendezvous.")
    assert port.hint.startswith("--master-port=$((10000 + SLURM_JOB_ID * 8 % 22768)) (a port per job)")


@pytest.mark.parametrize(("launch", "why"), [
    (f"srun -K {STATIC} --node_rank=0 t.py", "--node-rank=0 is the same on every node"),
    (f"srun -K {STATIC} --node-rank 1 t.py", "--node-rank=1 is the same on every node"),
    (f"srun -K {STATIC} --node-rank=$SLURM_NODEID t.py", "--node-rank=$SLURM_NODEID is expanded once, by the batch "
     "shell before srun starts, to the same value on every node"),
    (f'srun -K bash -c "{STATIC} --node-rank=$SLURM_NODEID t.py"', "is expanded once, by the batch shell"),
    ("srun -K torchrun --nnodes=2 --nproc-per-node=4 --rdzv-endpoint=$h:$p t.py", "and no --node-rank"),
    (f"srun -K {STATIC} --node-rank=$SLURM_NODEID --rdzv-backend=c10d t.py", None),
    (f"srun -K bash -c '{STATIC} --node-rank=$SLURM_NODEID t.py'", None),
    (f"srun -K bash -c 'cd /x && exec {STATIC} --node_rank=${{SLURM_NODEID}} t.py'", None),
    (f"srun -K -N1 -n1 {STATIC.replace('nnodes=2', 'nnodes=1')} t.py", None),
])


def test_torchrun_node_rank_must_differ_per_node(launch: str, why: str | None) -> None:
    found = [f for f in lint(TORCHRUN_JOB + launch + "\n") if f.code == "torchrun-node-rank"]
    assert [why in f.message for f in found] == ([True] if why else [])
    assert all(f.severity == "error" and f.hint.startswith("--node-rank=$SLURM_NODEID") for f in found)


@pytest.mark.parametrize(("addr", "flagged"), [("$(hostname)", True), ("`hostname`", True), ("$MASTER_ADDR", False)])
def test_master_addr_from_hostname_inside_each_task_names_every_node_master(addr: str, flagged: bool) -> None:
    launch = f"srun -K bash -c 'exec {STATIC.replace('$head', addr)} --node-rank=$SLURM_NODEID t.py'\n"
    found = [f for f in lint(TORCHRUN_JOB + launch) if f.code == "torchrun-master-addr"]
    assert bool(found) is flagged
    if found:
        assert found[0].message == (f"line 3: torchrun --master-addr={addr} is expanded by each task, so every node "
                                    "names itself as the master and no node finds the others.")
    # in the batch shell $(hostname) is the first node's name, once: right
    assert not _only(TORCHRUN_JOB + f"srun -K {STATIC.replace('$head', addr)} --node-rank=1 t.py\n",
                     "torchrun-master-addr")



def test_a_standalone_torchrun_on_two_nodes_is_said_once_as_standalone() -> None:
    for extra in ("", " --master-addr=h", " --node-rank=0"):
        text = ("#!/bin/bash\n#SBATCH --nodes=2\n"
                f"srun -K torchrun --standalone --nnodes=2{extra} --nproc-per-node=4 t.py\n")
        assert [f.code for f in lint(text) if f.code.startswith("torchrun")] == ["torchrun-standalone"], extra


def test_a_single_node_torchrun_with_nnodes_from_a_variable_needs_no_rendezvous() -> None:
    text = "#!/bin/bash\n#SBATCH --nodes=1\nsrun -K torchrun --nnodes=$SLURM_NNODES --nproc-per-node=4 t.py\n"
    assert [f.code for f in lint(text) if f.code.startswith("torchrun")] == []
