"""lint(): every registered rule run on a script; every pitfall of the classic scripts in
tests/fixtures/seed_scripts is flagged, our own rendered scripts are clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchslurm.jobs.sbatch import render
from torchslurm.jobs.spec import JobSpec
from torchslurm.lint.allocation import Allocation
from torchslurm.lint.parse import parse
from torchslurm.lint.report import lint, run_rules
from torchslurm.lint.rule import Facts, Flag, Rule

FIXTURES = Path(__file__).parents[2] / "fixtures"
SEEDS = FIXTURES / "seed_scripts"

# What each seed script gets wrong, by the seed's own text (see the fixture headers).
EXPECTED = {
    "seed000_pytorch_distributed.sbatch": {"hard-coded-master-addr", "fixed-master-port", "batch-shell-rank",
                                           "no-kill-on-bad-exit", "srun-cpus-per-task"},
    "seed002_run_distributed.slurm": {"fixed-port", "log-dir", "no-kill-on-bad-exit", "srun-cpus-per-task"},
    "seed003_ex1_single_gpu.sbatch": {"launcher-without-srun", "deprecated-launch", "fixed-port"},
    "seed003_ex2_multi_gpu.sbatch": {"ntasks-mismatch", "launcher-without-srun", "deprecated-launch", "fixed-port"},
    "seed003_ex3_process_split.sbatch": {"launcher-without-srun", "deprecated-launch", "fixed-port"},
    "seed004_run_nccl.slurm": {"hard-coded-master-addr", "fixed-master-port", "per-rank-nic",
                               "nccl-ib-disabled", "no-kill-on-bad-exit"},
    "lab_signal_batch_only.sbatch": {"signal-unreachable", "export-none-bare-python", "signal-without-requeue",
                                     "no-kill-on-bad-exit"},
    "lab_torchrun_signal.sbatch": {"signal-kills-torchrun", "no-kill-on-bad-exit", "srun-cpus-per-task"},
}


def test_every_fixture_has_expectations() -> None:
    assert sorted(p.name for p in SEEDS.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_seed_script_pitfalls(name: str) -> None:
    found = lint((SEEDS / name).read_text(), path_exists=lambda p: False)
    assert {f.code for f in found} == EXPECTED[name]
    assert all("HINT" not in f.message and f.hint for f in found)


@pytest.mark.parametrize("golden", sorted((FIXTURES / "golden").glob("*.sbatch")), ids=lambda p: p.stem)
def test_rendered_scripts_lint_clean(golden: Path) -> None:
    assert [str(f) for f in lint(golden.read_text(), path_exists=lambda p: True)] == []


def test_rendered_preemptible_torchrun_not_flagged_for_signal() -> None:
    spec = JobSpec(script="t.py", nodes=2, launch="torchrun", nproc_per_node=2, cpus_per_task=2,
                   preemptible=True, signal="USR1", time="60")
    assert lint(render(spec)) == []


def test_messages_name_the_line_and_value() -> None:
    (f,) = [f for f in lint((SEEDS / "seed000_pytorch_distributed.sbatch").read_text())
            if f.code == "fixed-master-port"]
    assert f.message.startswith("line 17: MASTER_PORT=12355 is fixed")
    assert "derives the port from SLURM_JOB_ID" in f.hint



def _facts() -> Facts:
    script = parse("#!/bin/bash\n")
    return Facts(script, Allocation.of(script.directives))


def test_a_superseding_rule_drops_the_other_rules_flags_on_its_line_about_its_option() -> None:
    better = Rule("better", ("error",), "says it better.", lambda x: [Flag("error", "b", "h", line=3, about="nodes")],
                  supersedes=("worse",))
    worse = Rule("worse", ("error", "warning"), "says it worse.", lambda x: [
        Flag("error", "same", "h", line=3, about="nodes"), Flag("warning", "other option", "h", line=3, about="time"),
        Flag("error", "other line", "h", line=4, about="nodes")])
    found = run_rules(_facts(), [worse, better])
    assert [(f.code, f.message) for f in found] == [
        ("worse", "line 4: other line"), ("better", "line 3: b"), ("worse", "line 3: other option")]


def test_a_severity_the_rule_did_not_declare_is_refused() -> None:
    liar = Rule("liar", ("info",), "claims info.", lambda x: [Flag("error", "m", "h")])
    with pytest.raises(AssertionError, match="liar flagged error"):
        run_rules(_facts(), [liar])


@pytest.mark.parametrize(("directive", "codes"), [
    ("-nodes=3", ["one-dash-option"]),  # not also `invalid-value` for the -n it is read as
    ("-nodes=3 --time=abc", ["invalid-value", "one-dash-option"]),  # another option of the line is still judged
])
def test_one_dash_option_supersedes_invalid_value(directive: str, codes: list[str]) -> None:
    assert sorted(f.code for f in lint(f"#!/bin/bash\n#SBATCH {directive}\nsrun python t.py\n")) == codes


def test_torchrun_standalone_supersedes_torchrun_nnodes() -> None:
    text = "#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1\nsrun -K torchrun --standalone --nnodes=1 t.py\n"
    assert [f.code for f in lint(text)] == ["torchrun-standalone"]


def test_a_rule_may_run_without_the_rules_it_supersedes() -> None:
    better = Rule("better", ("error",), "says it better.", lambda x: [Flag("error", "b", "h", line=3)],
                  supersedes=("absent",))
    assert [(f.code, f.message) for f in run_rules(_facts(), [better])] == [("better", "line 3: b")]
