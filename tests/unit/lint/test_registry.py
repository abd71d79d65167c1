"""The lint rule registry: every rule declared once, the docs' table the same rules, and each rule
shown to fire on a script with its mistake and to stay quiet on the fixed script."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from torchslurm.cli.lint import bash_syntax
from torchslurm.jobs.findings import Finding
from torchslurm.lint.checks import lint
from torchslurm.lint.parse import parse
from torchslurm.lint.registry import RULES, Context, Rule, rule, run

DOCS = Path(__file__).parents[3] / "docs" / "lint.md"
GPUS4 = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-node=4\n"
ONE_TASK = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=4\n"
KILL = "srun --kill-on-bad-exit=1"
C10D = ('--rdzv-backend=c10d --rdzv-endpoint="$head:$port" --rdzv-id=$SLURM_JOB_ID')


def _table() -> dict[frozenset[str], set[str]]:
    """docs/lint.md's rule table: the codes of each row -> the severities it lists."""
    rows = {}
    for line in DOCS.read_text().splitlines():
        m = re.match(r"^\| (`[a-z0-9-]+`(?:, `[a-z0-9-]+`)*) \| ([a-z /]+) \|", line)
        if m:
            rows[frozenset(re.findall(r"`([a-z0-9-]+)`", m.group(1)))] = set(m.group(2).split(" / "))
    return rows


def test_the_docs_table_lists_exactly_the_registered_rules() -> None:
    documented = {code for codes in _table() for code in codes}
    assert documented == set(RULES), f"only in docs: {documented - set(RULES)}, only in code: {set(RULES) - documented}"


def test_the_docs_table_gives_each_rules_severities() -> None:
    for codes, severities in _table().items():
        assert {s for code in codes for s in RULES[code].severities} == severities, sorted(codes)


def test_every_rule_has_a_summary_and_at_least_one_severity() -> None:
    assert all(r.summary.endswith(".") and r.severities for r in RULES.values())


def test_a_rule_cannot_be_declared_twice() -> None:
    with pytest.raises(AssertionError, match="declared twice"):
        rule("no-shebang", "error", summary="again.")(lambda c: [])


def test_a_rule_reports_only_under_its_own_code() -> None:
    liar = Rule("mine", ("error",), "lies.", lambda c: [Finding("error", "other", "x", "y")])
    with pytest.raises(AssertionError, match="lint rule mine reported"):
        run(Context(parse("#!/bin/bash\n")), [liar])


def test_a_rule_that_yields_loses_its_finding_on_the_same_line_only() -> None:
    says_better = Rule("better", ("error",), "s.", lambda c: [Finding("error", "better", "line 2: b", "")])
    yields = Rule("worse", ("error",), "s.", lambda c: [Finding("error", "worse", "line 2: w", ""),
                                                        Finding("error", "worse", "line 3: w", "")],
                  yield_to=("better",))
    found = run(Context(parse("#!/bin/bash\n")), [says_better, yields])
    assert [f.message for f in found] == ["line 2: b", "line 3: w"]


# code -> (a script with the mistake, the same script fixed). Every registered rule needs a pair.
CASES: dict[str, tuple[str, str]] = {
    "bash-syntax": (GPUS4 + "if true; then\n", GPUS4 + "if true; then :; fi\n"),
    "no-shebang": ("#SBATCH --nodes=1\npython train.py\n", "#!/bin/bash\n#SBATCH --nodes=1\npython train.py\n"),
    "unknown-option": (GPUS4 + "#SBATCH --nodse=2\n", GPUS4 + "#SBATCH --time=10\n"),
    "invalid-value": ("#!/bin/bash\n#SBATCH --nodes=0\n", "#!/bin/bash\n#SBATCH --nodes=1\n"),
    "one-dash-option": ("#!/bin/bash\n#SBATCH -nodes=3\n", "#!/bin/bash\n#SBATCH --nodes=3\n"),
    "ignored-directive": ("#!/bin/bash\n# SBATCH --nodes=2\n#SBATCH --time=10\n",
                          "#!/bin/bash\n##SBATCH --nodes=2\n#SBATCH --time=10\n"),
    "late-directive": ("#!/bin/bash\necho hi\n#SBATCH --nodes=2\n", "#!/bin/bash\n#SBATCH --nodes=2\necho hi\n"),
    "no-directives": ("#!/bin/bash\necho hi\n", "#!/bin/bash\n#SBATCH --nodes=1\necho hi\n"),
    "assign-space": (GPUS4 + "NCCL_DEBUG= INFO\n", GPUS4 + "NCCL_DEBUG=INFO\n"),
    "ntasks-mismatch": (GPUS4 + "#SBATCH --ntasks=6\n", GPUS4 + "#SBATCH --ntasks=8\n"),
    "tasks-vs-gpus": ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --gpus-per-node=4\n"
                      f"{KILL} python train.py\n", GPUS4 + f"{KILL} python train.py\n"),
    "srun-tasks-vs-gpus": (GPUS4 + f"{KILL} --ntasks-per-node=8 python train.py\n",
                           GPUS4 + f"{KILL} --ntasks-per-node=4 python train.py\n"),
    "nproc-vs-gpus": (ONE_TASK + f"{KILL} torchrun --nproc-per-node=2 --nnodes=2 {C10D} train.py\n",
                      ONE_TASK + f"{KILL} torchrun --nproc-per-node=4 --nnodes=2 {C10D} train.py\n"),
    "launcher-per-task": (GPUS4 + f"{KILL} torchrun --nproc-per-node=4 --nnodes=2 {C10D} train.py\n",
                          ONE_TASK + f"{KILL} torchrun --nproc-per-node=4 --nnodes=2 {C10D} train.py\n"),
    "python-without-srun": (GPUS4 + "python train.py\n", GPUS4 + f"{KILL} python train.py\n"),
    "launcher-without-srun": (ONE_TASK + f"torchrun --nproc-per-node=4 --nnodes=2 {C10D} train.py\n",
                              ONE_TASK + f"{KILL} torchrun --nproc-per-node=4 --nnodes=2 {C10D} train.py\n"),
    "torchrun-no-rendezvous": (ONE_TASK + f"{KILL} torchrun --nproc-per-node=4 --nnodes=2 train.py\n",
                               ONE_TASK + f"{KILL} torchrun --nproc-per-node=4 --nnodes=2 {C10D} train.py\n"),
    "torchrun-standalone": (ONE_TASK + f"{KILL} torchrun --standalone --nproc-per-node=4 train.py\n",
                            ONE_TASK + f"{KILL} torchrun --nproc-per-node=4 --nnodes=2 {C10D} train.py\n"),
    "torchrun-nnodes": (ONE_TASK + f"{KILL} torchrun --nproc-per-node=4 --nnodes=3 {C10D} train.py\n",
                        ONE_TASK + f"{KILL} torchrun --nproc-per-node=4 --nnodes=2 {C10D} train.py\n"),
    "torchrun-node-rank": (ONE_TASK + f"{KILL} torchrun --nproc-per-node=4 --nnodes=2 --master-addr=$head "
                           "--master-port=$port train.py\n",
                           ONE_TASK + f"{KILL} bash -c 'exec torchrun --nproc-per-node=4 --nnodes=2 "
                           "--node-rank=$SLURM_NODEID --master-addr=$head --master-port=$port train.py'\n"),
    "torchrun-master-addr": (ONE_TASK + f"{KILL} bash -c 'exec torchrun --nproc-per-node=4 --nnodes=2 "
                             "--node-rank=$SLURM_NODEID --master-addr=$(hostname) --master-port=$port train.py'\n",
                             ONE_TASK + f"{KILL} bash -c 'exec torchrun --nproc-per-node=4 --nnodes=2 "
                             "--node-rank=$SLURM_NODEID --master-addr=$head --master-port=$port train.py'\n"),
    "launcher-nodes": (ONE_TASK + f"{KILL} accelerate launch --num_machines 1 --num_processes 8 "
                       "--rdzv_backend c10d train.py\n",
                       ONE_TASK + f"{KILL} accelerate launch --num_machines 2 --num_processes 8 "
                       "--rdzv_backend c10d train.py\n"),
    "launcher-processes": (ONE_TASK + f"{KILL} accelerate launch --num_machines 2 --num_processes 4 "
                           "--rdzv_backend c10d train.py\n",
                           ONE_TASK + f"{KILL} accelerate launch --num_machines 2 --num_processes 8 "
                           "--rdzv_backend c10d train.py\n"),
    "launcher-node-rank": (ONE_TASK + f"{KILL} accelerate launch --num_machines 2 --num_processes 8 "
                           "--machine_rank 0 train.py\n",
                           ONE_TASK + f"{KILL} accelerate launch --num_machines 2 --num_processes 8 "
                           "--machine_rank 0 --rdzv_backend c10d train.py\n"),
    "batch-shell-rank": (GPUS4 + f"{KILL} python train.py --rank=$SLURM_PROCID\n",
                         GPUS4 + f"{KILL} bash -c 'python train.py --rank=$SLURM_PROCID'\n"),
    "hard-coded-master-addr": (GPUS4 + f"export MASTER_ADDR=node01\n{KILL} python train.py\n",
                               GPUS4 + "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | "
                               f"head -n1)\n{KILL} python train.py\n"),
    "fixed-master-port": (GPUS4 + f"export MASTER_PORT=29500\n{KILL} python train.py\n",
                          GPUS4 + f"export MASTER_PORT=$((10000 + SLURM_JOB_ID % 20000))\n{KILL} python train.py\n"),
    "fixed-port": (ONE_TASK + f"{KILL} torchrun --nproc-per-node=4 --nnodes=2 --rdzv-backend=c10d "
                   "--rdzv-endpoint=$head:29500 --rdzv-id=$SLURM_JOB_ID train.py\n",
                   ONE_TASK + f"{KILL} torchrun --nproc-per-node=4 --nnodes=2 {C10D} train.py\n"),
    "signal-unreachable": (GPUS4 + f"#SBATCH --signal=B:USR1@90\n#SBATCH --requeue\n{KILL} python train.py\n",
                           GPUS4 + f"#SBATCH --signal=USR1@90\n#SBATCH --requeue\n{KILL} python train.py\n"),
    "signal-kills-torchrun": (ONE_TASK + "#SBATCH --signal=USR1@90\n#SBATCH --requeue\n"
                              f"{KILL} torchrun --nproc-per-node=4 --nnodes=2 {C10D} train.py\n",
                              ONE_TASK + "#SBATCH --signal=TERM@90\n#SBATCH --requeue\n"
                              f"{KILL} torchrun --nproc-per-node=4 --nnodes=2 {C10D} train.py\n"),
    "signal-without-requeue": (GPUS4 + f"#SBATCH --signal=USR1@90\n{KILL} python train.py\n",
                               GPUS4 + f"#SBATCH --signal=USR1@90\n#SBATCH --requeue\n{KILL} python train.py\n"),
    "export-none-bare-python": (GPUS4 + f"#SBATCH --export=NONE\n{KILL} python train.py\n",
                                GPUS4 + f"#SBATCH --export=NONE\n{KILL} /opt/venv/bin/python train.py\n"),
    "log-dir": (GPUS4 + "#SBATCH --output=~/logs/%j.out\n", GPUS4 + "#SBATCH --output=/home/me/logs/%j.out\n"),
    "per-rank-nic": (GPUS4 + 'case $SLURM_PROCID in 0) export NCCL_SOCKET_IFNAME=eth0;; esac\n'
                     f"{KILL} python train.py\n", GPUS4 + f"{KILL} python train.py\n"),
    "deprecated-launch": (ONE_TASK + f"{KILL} python -m torch.distributed.launch --nproc_per_node=4 --nnodes=2 "
                          f"{C10D} train.py\n", ONE_TASK + f"{KILL} python -m torch.distributed.run "
                          f"--nproc_per_node=4 --nnodes=2 {C10D} train.py\n"),
    "no-kill-on-bad-exit": (GPUS4 + "srun python train.py\n", GPUS4 + f"{KILL} python train.py\n"),
    "nccl-ib-disabled": (GPUS4 + f"export NCCL_IB_DISABLE=1\n{KILL} python train.py\n",
                         GPUS4 + f"export NCCL_IB_DISABLE=0\n{KILL} python train.py\n"),
}


def test_the_rules_live_in_the_rule_modules() -> None:
    homes = {r.check.__module__.rsplit(".", 1)[-1] for r in RULES.values()}
    assert homes == {"directives", "launch", "launchers", "ports", "slips"}


def test_every_rule_has_its_cases() -> None:
    assert set(CASES) == set(RULES), f"without cases: {set(RULES) - set(CASES)}; cases of no rule: " \
        f"{set(CASES) - set(RULES)}"


def _codes(text: str) -> set[str]:
    return {f.code for f in lint(text, path_exists=lambda p: True, syntax=bash_syntax)}


@pytest.mark.parametrize("code", sorted(CASES))
def test_the_rule_fires_on_its_mistake_and_not_on_the_fix(code: str) -> None:
    if code == "bash-syntax" and shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    wrong, fixed = CASES[code]
    assert code in _codes(wrong)
    assert code not in _codes(fixed)
