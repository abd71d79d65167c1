"""lint rules of what the batch shell sets up (lint/batch.py): MASTER_ADDR, per-rank NICs, --signal, ranks."""

from __future__ import annotations

import pytest

from torchslurm.lint.report import lint

H = "#!/bin/bash\n#SBATCH --ntasks=2\n"


@pytest.mark.parametrize(("lines", "flagged"), [
    ("export RANK=$SLURM_PROCID\nsrun -K python t.py\n", "line 3: RANK=$SLURM_PROCID is evaluated once"),
    ("RANK=$SLURM_PROCID\nsrun -K python t.py\n", None),  # not exported: no task sees it
    ("export MY_ID=$SLURM_PROCID\nsrun -K python t.py\n", None),  # no program reads it as its rank
    ("srun -K python t.py --seed=$((SLURM_PROCID + 1))\n", "line 3: `--seed=$SLURM_PROCID` is expanded once"),
])
def test_batch_shell_rank_reads_exports_and_launch_words(lines: str, flagged: str | None) -> None:
    found = [f.message for f in lint(H + lines) if f.code == "batch-shell-rank"]
    assert [m.startswith(flagged) for m in found] == ([True] if flagged else [])


def test_a_launchers_node_rank_is_left_to_the_rendezvous_rules() -> None:
    text = H + "srun -K torchrun --nnodes=2 --node-rank=$SLURM_NODEID --rdzv-backend=c10d --rdzv-endpoint=$h:$p t\n"
    assert "batch-shell-rank" not in {f.code for f in lint(text)}


def test_rank_case_inside_srun_bash_c_is_found_on_its_line() -> None:
    text = H + "srun -K bash -c '\ncase $SLURM_LOCALID in\n 0) export NCCL_SOCKET_IFNAME=ib0 ;;\nesac\npython t.py'\n"
    (f,) = [f for f in lint(text) if f.code == "per-rank-nic"]
    assert f.message.startswith("line 5: a `case` on the rank picks *_SOCKET_IFNAME")


def test_signal_findings_name_the_signal_and_the_fix() -> None:
    text = "#!/bin/bash\n#SBATCH --signal=B:USR2@90\nsrun python t.py\n"
    found = {f.code: f for f in lint(text)}
    assert found["signal-unreachable"].hint.startswith("--signal=USR2@90 (without B:)")
    assert found["signal-without-requeue"].message.startswith("--signal=B:USR2@90 without --requeue")


@pytest.mark.parametrize(("lines", "severity"), [
    ("export RANK=$SLURM_PROCID\nsrun -K python t.py\n", "warning"),  # nothing shows that t.py reads it
    ("export RANK=$SLURM_PROCID\nsrun -K python t.py --rank $RANK\n", "error"),  # handed over as its rank
    ("export RANK=$SLURM_PROCID\nsrun -K bash -c 'torchrun --node_rank=$RANK t.py'\n", "error"),
])
def test_an_exported_batch_shell_rank_is_an_error_only_where_a_launch_passes_it(lines: str, severity: str) -> None:
    (f,) = [f for f in lint(H + lines) if f.code == "batch-shell-rank" and f.message.startswith("line 3:")]
    assert f.severity == severity and f.message.startswith("line 3: RANK=$SLURM_PROCID is evaluated once")


@pytest.mark.parametrize(("directives", "lines", "flagged"), [
    ("--signal=SIGUSR1@90", "python train.py\n", True),  # no step: nobody gets it
    ("--signal=USR1@90", "torchrun --nproc-per-node=1 train.py\n", True),
    ("--signal=USR1@90", "srun -K python train.py\n", False),
    ("--signal=USR1@90", "python prep.py\nsrun -K python train.py\n", False),
    ("--signal=B:USR1@90", "python train.py & pid=$!\ntrap 'kill -USR1 $pid' USR1\nwait\n", False),
])
def test_signal_without_b_reaches_only_job_steps(directives: str, lines: str, flagged: bool) -> None:
    text = f"#!/bin/bash\n#SBATCH --ntasks=1 --requeue {directives}\n{lines}"
    found = [f for f in lint(text) if f.code == "signal-unreachable"]
    assert bool(found) is flagged
    if found:
        assert found[0].message.startswith(f"line 3: {directives} is sent only to job steps")
        assert found[0].hint.startswith("srun ")
