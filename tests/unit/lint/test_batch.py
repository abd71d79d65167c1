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


_RANK_HINT = "remove it: each task sets RANK from its own SLURM_* variables (torchslurm.init() reads them)."


@pytest.mark.parametrize(("launch", "severity", "consequence"), [
    ("srun -K python t.py --rank $RANK --seed 1", "error",
     "a launch line passes it on: every rank gets the same value."),
    ("srun -K --export=ALL,RANK=$RANK python t.py", "error",
     "a launch line passes it on: every rank gets the same value."),
    ("srun --export=ALL,RANK=$RANK python t.py", "error",
     "a launch line passes it on: every rank gets the same value."),
    ("srun -K python t.py", "warning", "every task inherits it: a program that reads RANK (torch's env:// rendezvous "
     "does) gets the same rank everywhere."),
])
def test_an_exported_rank_says_who_gets_the_batch_shells_value(launch: str, severity: str, consequence: str) -> None:
    found = [f for f in lint(H + f"export RANK=$SLURM_PROCID\n{launch}\n") if f.code == "batch-shell-rank"]
    assert [(f.severity, f.message, f.hint) for f in found if f.message.startswith("line 3")] == [
        (severity, f"line 3: RANK=$SLURM_PROCID is evaluated once in the batch shell, where SLURM_PROCID is 0, and "
                   f"{consequence}", _RANK_HINT)]


def test_every_srun_line_with_a_rank_word_is_said_once_and_lines_without_srun_are_passed_over() -> None:
    text = H + ("python prep.py --seed=$SLURM_PROCID\nsrun -K python t.py --seed=$SLURM_PROCID --id=$SLURM_PROCID\n"
                "srun -K python e.py --id=$SLURM_LOCALID\n")
    found = [f for f in lint(text) if f.code == "batch-shell-rank"]
    assert [f.message.split(" is expanded")[0] for f in found] == ["line 4: `--seed=$SLURM_PROCID`",
                                                                    "line 5: `--id=$SLURM_LOCALID`"]
    assert found[1].hint == ("let each task expand it: srun bash -c '... $SLURM_LOCALID ...' (single quotes), or "
                             "drop it: torchslurm.init() and the launchers give each rank its own.")


@pytest.mark.parametrize("option", ["--node_rank=$SLURM_NODEID", "--node-rank=$SLURM_NODEID",
                                    "--node-rank $SLURM_NODEID"])
def test_a_launchers_node_rank_in_any_spelling_is_left_to_the_rendezvous_rules(option: str) -> None:
    text = H + f"srun -K torchrun --nnodes=2 {option} --master-addr=h --master-port=1 t.py\n"
    assert "batch-shell-rank" not in {f.code for f in lint(text)}
    text = H + "srun -K python t.py Xnode-rank=$SLURM_NODEID\n"  # no option of a launcher: the program's word
    assert "batch-shell-rank" in {f.code for f in lint(text)}


def test_a_rank_case_is_said_once_on_its_first_assignment_and_ends_at_esac() -> None:
    text = H + ("case $SLURM_LOCALID in\n  # NCCL_SOCKET_IFNAME per rank\n  0) export NCCL_SOCKET_IFNAME=ib0 ;;\n"
                "  1) export NCCL_SOCKET_IFNAME=ib1 ;;\nesac\nexport GLOO_SOCKET_IFNAME=eth0\nsrun -K python t.py\n")
    assert [f.message.split(":")[0] for f in lint(text) if f.code == "per-rank-nic"] == ["line 5"]
    text = H + "case $SLURM_LOCALID in\n  0) echo first ;;\nesac\nexport NCCL_SOCKET_IFNAME=ib0\nsrun -K python t.py\n"
    assert "per-rank-nic" not in {f.code for f in lint(text)}
