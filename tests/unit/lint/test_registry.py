"""The rule registry: every rule declared once, agreeing with docs/lint.md's table, and each with a script
that fires it and one that does not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchslurm.jobs.findings import SEVERITIES
from torchslurm.lint.registry import RULES, by_code
from torchslurm.lint.report import lint
from torchslurm.lint.rule import Rule

DOCS = Path(__file__).parents[3] / "docs" / "lint.md"
H = "#!/bin/bash\n"
C10D = "--rdzv-backend=c10d --rdzv-endpoint=$h:$p"
TWO_NODES = H + "#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=4\n"
STATIC = "torchrun --nnodes=2 --nproc-per-node=4 --master-port=$port"
LAUNCHER_PER_NODE = f"srun -K torchrun --nproc-per-node=4 --nnodes=2 {C10D} t.py\n"
ACCELERATE = TWO_NODES + "srun -K accelerate launch --num_machines 2 "

# code -> (a script the rule flags, a script it does not flag): the smallest change between the two
CASES: dict[str, tuple[str, str]] = {
    "no-shebang": ("#SBATCH -N 1\nsrun python t.py\n", H + "#SBATCH -N 1\nsrun python t.py\n"),
    "dos-line-breaks": (H + "#SBATCH -N 1\r\nsrun python t.py\r\n", H + "#SBATCH -N 1\nsrun python t.py\n"),
    "unknown-option": (H + "#SBATCH --nodse=2\nsrun python t.py\n", H + "#SBATCH --nodes=2\nsrun python t.py\n"),
    "invalid-value": (H + "#SBATCH --time=abc\nsrun python t.py\n", H + "#SBATCH --time=90\nsrun python t.py\n"),
    "late-directive": (H + "#SBATCH -N 1\necho hi\n#SBATCH -t 5\n", H + "#SBATCH -N 1\n#SBATCH -t 5\necho hi\n"),
    "no-directives": (H + "echo hello\n", H + "#SBATCH -N 1\necho hello\n"),
    "ntasks-mismatch": (H + "#SBATCH -N 2 --ntasks-per-node=2 --ntasks=3\nsrun -K python t.py\n",
                        H + "#SBATCH -N 2 --ntasks-per-node=2 --ntasks=4\nsrun -K python t.py\n"),
    "deprecated-launch": (H + "#SBATCH -N 1\npython -m torch.distributed.launch --nproc_per_node=1 t.py\n",
                          H + "#SBATCH -N 1\ntorchrun --nproc_per_node=1 t.py\n"),
    "python-without-srun": (H + "#SBATCH --ntasks=4\npython t.py\n", H + "#SBATCH --ntasks=4\nsrun -K python t.py\n"),
    "launcher-without-srun": (H + "#SBATCH -N 2\ntorchrun --nnodes=2 t.py\n", H + "#SBATCH -N 1\ntorchrun t.py\n"),
    "launcher-per-task": (H + f"#SBATCH -N 2 --ntasks-per-node=4 --gpus-per-node=4\n{LAUNCHER_PER_NODE}",
                          H + f"#SBATCH -N 2 --ntasks-per-node=1 --gpus-per-node=4\n{LAUNCHER_PER_NODE}"),
    "nproc-vs-gpus": (H + "#SBATCH --ntasks-per-node=1 --gpus-per-node=4\nsrun -K torchrun --nproc-per-node=2 t.py\n",
                      H + "#SBATCH --ntasks-per-node=1 --gpus-per-node=4\nsrun -K torchrun --nproc-per-node=4 t.py\n"),
    "srun-tasks-vs-gpus": (H + "#SBATCH -N 2 --ntasks-per-node=4 --gpus-per-node=4\nsrun -K -n 2 python t.py\n",
                           H + "#SBATCH -N 2 --ntasks-per-node=4 --gpus-per-node=4\nsrun -K python t.py\n"),
    "tasks-vs-gpus": (H + "#SBATCH -N 2 --ntasks-per-node=1 --gpus-per-node=4\nsrun -K python t.py\n",
                      H + "#SBATCH -N 2 --ntasks-per-node=4 --gpus-per-node=4\nsrun -K python t.py\n"),
    "no-kill-on-bad-exit": (H + "#SBATCH --ntasks=4\nsrun python t.py\n",
                            H + "#SBATCH --ntasks=4\nsrun -K python t.py\n"),
    "torchrun-no-rendezvous": (TWO_NODES + "srun -K torchrun --nnodes=2 --nproc-per-node=4 t.py\n",
                               TWO_NODES + f"srun -K torchrun --nnodes=2 --nproc-per-node=4 {C10D} t.py\n"),
    "torchrun-standalone": (TWO_NODES + "srun -K torchrun --standalone --nproc-per-node=4 t.py\n",
                            TWO_NODES + "srun -K -N1 -n1 torchrun --standalone --nproc-per-node=4 t.py\n"),
    "torchrun-nnodes": (TWO_NODES + f"srun -K torchrun --nnodes=1 --nproc-per-node=4 {C10D} t.py\n",
                        TWO_NODES + f"srun -K torchrun --nnodes=2 --nproc-per-node=4 {C10D} t.py\n"),
    "torchrun-node-rank": (TWO_NODES + f"srun -K {STATIC} --master-addr=$head --node_rank=0 t.py\n",
                           TWO_NODES + f"srun -K bash -c '{STATIC} --master-addr=$head --node-rank=$SLURM_NODEID t'\n"),
    "torchrun-master-addr": (
        TWO_NODES + f"srun -K bash -c '{STATIC} --master-addr=$(hostname) --node-rank=$SLURM_NODEID t.py'\n",
        TWO_NODES + f"srun -K bash -c '{STATIC} --master-addr=$MASTER_ADDR --node-rank=$SLURM_NODEID t.py'\n"),
    "launcher-nodes": (H + "#SBATCH -N 2 --gpus-per-node=4\ndeepspeed --num_nodes=1 --num_gpus=4 t.py\n",
                       H + "#SBATCH -N 2 --gpus-per-node=4\ndeepspeed --num_nodes=2 --num_gpus=4 t.py\n"),
    "launcher-processes": (ACCELERATE + "--num_processes 4 --rdzv_backend c10d t.py\n",
                           ACCELERATE + "--num_processes 8 --rdzv_backend c10d t.py\n"),
    "launcher-node-rank": (ACCELERATE + "--num_processes 8 --machine_rank 0 t.py\n",
                           ACCELERATE + "--num_processes 8 --machine_rank 0 --rdzv_backend c10d t.py\n"),
    "ssh-launcher-under-srun": (TWO_NODES + "srun -K deepspeed --hostfile hf --num_gpus 4 t.py\n",
                                TWO_NODES + "srun -K -N1 -n1 deepspeed --hostfile hf --num_gpus 4 t.py\n"),
    "fixed-master-port": (H + "#SBATCH --gpus-per-node=4\ntorchrun --nproc-per-node=4 --master-port 29400 t.py\n",
                          H + "#SBATCH --gpus-per-node=4\ntorchrun --nproc-per-node=4 --master-port=$port t.py\n"),
    "fixed-port": (H + "#SBATCH --gpus-per-node=4\ntorchrun --nproc-per-node=4 --rdzv-endpoint=localhost:29400 t\n",
                   H + "#SBATCH --gpus-per-node=4\ntorchrun --nproc-per-node=4 --rdzv-endpoint=$head:$port t\n"),
    "nccl-ib-disabled": (H + "#SBATCH -N 1\nexport NCCL_IB_DISABLE=1\nsrun python t.py\n",
                         H + "#SBATCH -N 1\nexport NCCL_IB_DISABLE=0\nsrun python t.py\n"),
    "hard-coded-master-addr": (H + "#SBATCH -N 1\nexport MASTER_ADDR=node01\nsrun python t.py\n",
                               H + "#SBATCH -N 1\nexport MASTER_ADDR=$(hostname)\nsrun python t.py\n"),
    "per-rank-nic": (H + "#SBATCH -N 1\ncase $SLURM_NODEID in\n0) export NCCL_SOCKET_IFNAME=eth0 ;;\nesac\n",
                     H + "#SBATCH -N 1\ncase $HOSTNAME in\ngpu*) export NCCL_SOCKET_IFNAME=eth0 ;;\nesac\n"),
    "signal-unreachable": (H + "#SBATCH --signal=USR1@60 --requeue\npython t.py\n",
                           H + "#SBATCH --signal=USR1@60 --requeue\nsrun python t.py\n"),
    "signal-kills-torchrun": (H + "#SBATCH --signal=USR1@60 --requeue\nsrun torchrun --nproc-per-node=1 t.py\n",
                              H + "#SBATCH --signal=USR1@60 --requeue\nsrun python t.py\n"),
    "signal-without-requeue": (H + "#SBATCH --signal=USR1@60\nsrun python t.py\n",
                               H + "#SBATCH --signal=USR1@60 --requeue\nsrun python t.py\n"),
    "export-none-bare-python": (H + "#SBATCH -N 1 --export=NONE\nsrun python t.py\n",
                                H + "#SBATCH -N 1 --export=NONE\nsrun /opt/venv/bin/python t.py\n"),
    "batch-shell-rank": (H + "#SBATCH --ntasks=2\nsrun -K python t.py --rank=$SLURM_PROCID\n",
                         H + "#SBATCH --ntasks=2\nsrun -K bash -c 'python t.py --rank=$SLURM_PROCID'\n"),
    "assign-space": (H + "#SBATCH -N 1\nNCCL_DEBUG= INFO\nsrun python t.py\n",
                     H + "#SBATCH -N 1\nNCCL_DEBUG=INFO\nsrun python t.py\n"),
    "ignored-directive": (H + "# SBATCH --nodes=2\n#SBATCH -t 5\nsrun python t.py\n",
                          H + "##SBATCH --nodes=2\n#SBATCH -t 5\nsrun python t.py\n"),
    "unread-lines": (H + "#SBATCH -N 1\ncat <<EOF >c.yaml\nlr: 1\nEOF \nsrun python t.py\n",
                     H + "#SBATCH -N 1\ncat <<EOF >c.yaml\nlr: 1\nEOF\nsrun python t.py\n"),
    "one-dash-option": (H + "#SBATCH -nodes=3\nsrun python t.py\n", H + "#SBATCH --nodes=3\nsrun python t.py\n"),
    "log-dir": (H + "#SBATCH --output=out/%j.log\nsrun python t.py\n",
                H + "#SBATCH --output=logs/%j.log\nsrun python t.py\n"),
    "srun-cpus-per-task": (H + "#SBATCH -c 8\nsrun python t.py\n",
                           H + "#SBATCH -c 8\nexport SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK\nsrun python t.py\n"),
    "bash-syntax": (H + "#SBATCH -N 1\nif then\n", H + "#SBATCH -N 1\nsrun python t.py\n"),
    "container-without-gpus": (H + "#SBATCH --gpus-per-node=1\nsrun -K apptainer exec i.sif python t.py\n",
                               H + "#SBATCH --gpus-per-node=1\nsrun -K apptainer exec --nv i.sif python t.py\n"),
}


def _codes(text: str) -> set[str]:
    """What lint finds in `text` where only `logs/` exists and bash refuses only `if then`."""
    return {f.code for f in lint(text, path_exists=lambda path: path == "logs",
                                 syntax=lambda t: (2, "syntax error near `then'") if "\nif then" in t else None)}


def test_every_rule_has_cases_and_every_case_a_rule() -> None:
    assert sorted(CASES) == sorted(by_code())


@pytest.mark.parametrize("code", [r.code for r in RULES])
def test_rule_fires_on_its_script_and_not_on_the_fixed_one(code: str) -> None:
    fires, quiet = CASES[code]
    assert code in _codes(fires)
    assert code not in _codes(quiet)


def test_codes_are_unique_and_kebab_case() -> None:
    codes = [r.code for r in RULES]
    assert len(codes) == len(set(codes))
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", code) for code in codes)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_rule_declaration_is_complete(rule: Rule) -> None:
    assert rule.severities and len(set(rule.severities)) == len(rule.severities)
    assert set(rule.severities) <= set(SEVERITIES)
    assert list(rule.severities) == sorted(rule.severities, key=SEVERITIES.index)  # as the table says them
    assert rule.summary.endswith((".", ".)")) and "\n" not in rule.summary and "|" not in rule.summary
    assert set(rule.supersedes) <= set(by_code()) - {rule.code}


def _docs_table() -> list[tuple[str, tuple[str, ...], str]]:
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| ([a-z /]+) \| (.*) \|$", DOCS.read_text(), re.MULTILINE)
    return [(code, tuple(severities.split(" / ")), summary) for code, severities, summary in rows]


def test_docs_table_lists_every_rule_as_the_registry_declares_it() -> None:
    assert _docs_table() == [(r.code, r.severities, r.summary) for r in RULES]
