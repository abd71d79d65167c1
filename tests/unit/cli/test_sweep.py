"""`torchslurm sweep`: the spec file's sweep: section and the flags, --dry-run, a submission and a
resubmission of what did not complete. sbatch and scontrol are replaced by recorders here (their
parsers are tested on recorded output in tests/unit/jobs; the real thing in tests/cluster/test_sweeps.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchslurm.cli import main
from torchslurm.jobs.sweepstate import OUTCOME_FILE, Outcome, read_manifest

SPEC = """
script: train.py
args: [epochs=1]
time: "10"
sweep:
  name: lr-seed
  grid: {lr: [0.001, 0.0003], seed: [0, 1]}
  max_parallel: 2
"""


class FakeSlurm:
    """sbatch answers job ids 100, 101, ...; scontrol answers the records a test sets per job."""

    def __init__(self) -> None:
        self.scripts: list[Path] = []
        self.records: dict[str, list[dict[str, str]]] = {}

    def submit(self, script: Path, cwd: Path | None = None) -> str:
        self.scripts.append(script)
        return str(99 + len(self.scripts))

    def show_jobs(self, job_id: str, timeout_s: float = 60, known: bool = True) -> list[dict[str, str]]:
        return self.records.get(job_id, [])


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeSlurm:
    fake = FakeSlurm()
    monkeypatch.setattr("torchslurm.jobs.slurm.SlurmClient.submit", lambda _, *a, **k: fake.submit(*a, **k))
    monkeypatch.setattr("torchslurm.jobs.slurm.SlurmClient.show_jobs", lambda _, *a, **k: fake.show_jobs(*a, **k))
    monkeypatch.setattr("torchslurm.jobs.slurm.SlurmClient.partition_nodes", lambda _, *a: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('training')\n")
    (tmp_path / "spec.yaml").write_text(SPEC)
    return fake


def test_dry_run_prints_the_array_and_the_points_and_writes_nothing(slurm: FakeSlurm, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--spec", "spec.yaml", "--dry-run", "--point", "lr=0.01,seed=7"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --array=0-4%2\n" in out and 'case "${SLURM_ARRAY_TASK_ID:-}" in' in out
    assert f"  4) point=4-lr=0.01,seed=7; point_args=(lr=0.01 seed=7 run_dir={tmp_path}/runs/lr-seed/4-lr=0.01," \
           "seed=7) ;;" in out
    assert "5 of 5 points to submit" in out
    assert "  3      yes     new    lr=0.0003, seed=1  3-lr=0.0003,seed=1" in out
    assert not (tmp_path / "runs").exists() and slurm.scripts == []


def test_a_typo_in_a_point_submits_nothing(slurm: FakeSlurm, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--spec", "spec.yaml", "--grid", "seed=0,1,2", "--point", "lr=0.1,momentun=0.5"]) == 2
    err = capsys.readouterr().err
    assert "error: point 6 (lr=0.1, momentun=0.5): unknown key(s) in its settings: momentun." in err
    assert "did you mean momentun -> momentum?" in err
    assert slurm.scripts == [] and not (tmp_path / "runs").exists()


def test_the_spec_files_other_keys_are_still_checked(slurm: FakeSlurm, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC + "nodez: 2\n")
    assert main(["sweep", "--spec", "spec.yaml"]) == 2
    assert "unknown key(s) in spec.yaml: nodez. HINT: did you mean nodez -> nodes?" in capsys.readouterr().err


def test_a_sweep_is_submitted_then_only_what_did_not_complete_again(slurm: FakeSlurm, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--spec", "spec.yaml"]) == 0
    out = capsys.readouterr().out
    sweep_dir = tmp_path / "runs" / "lr-seed"
    assert "submitted sweep lr-seed: job 100, array 0-3%2 (4 of 4 points)" in out
    assert f"logs:    {sweep_dir}/train-100_%a.out" in out and f"torchslurm results {sweep_dir}" in out
    first = read_manifest(sweep_dir)
    assert first is not None and [s.indices for s in first.submissions] == [(0, 1, 2, 3)]
    assert json.loads((sweep_dir / "sweep.json").read_text())["points"][2] == {
        "index": 2, "dir": "2-lr=0.0003,seed=0", "overrides": {"lr": 0.0003, "seed": 0}}

    # point 0 completed, 1 failed, 2 still pends in Slurm, 3 was cancelled before it wrote anything
    for index, state in ((0, "completed"), (1, "failed")):
        (sweep_dir / first.points[index].dir).mkdir()
        (sweep_dir / first.points[index].dir / OUTCOME_FILE).write_text(
            Outcome(state, 1, 45, 3.0, 1.0, "ValueError: boom" if state == "failed" else None).to_json())
    slurm.records["100"] = [
        {"JobId": "101", "ArrayJobId": "100", "ArrayTaskId": "1", "JobState": "FAILED", "ExitCode": "1:0"},
        {"JobId": "100", "ArrayJobId": "100", "ArrayTaskId": "2", "JobState": "PENDING", "Reason": "Priority"},
        {"JobId": "102", "ArrayJobId": "100", "ArrayTaskId": "3", "JobState": "CANCELLED", "ExitCode": "0:15"}]
    assert main(["sweep", "--spec", "spec.yaml", "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "#SBATCH --array=1,3%2\n" in dry and "\n  0) " not in dry and "2 of 4 points to submit" in dry
    assert "  1      yes     failed: ValueError: boom" in dry and "  2              pending: Priority" in dry
    assert main(["sweep", "--spec", "spec.yaml"]) == 0
    assert "submitted sweep lr-seed: job 101, array 1,3%2 (2 of 4 points)" in capsys.readouterr().out
    second = read_manifest(sweep_dir)
    assert second is not None and [s.indices for s in second.submissions] == [(0, 1, 2, 3), (1, 3)]
    assert [p.name for p in slurm.scripts] == ["train.sbatch", "train-2.sbatch"]

    slurm.records["101"] = [{"JobId": "103", "ArrayJobId": "101", "ArrayTaskId": "1,3", "JobState": "PENDING"}]
    assert main(["sweep", "--spec", "spec.yaml"]) == 0
    assert "all 4 points are completed, pending or running; nothing to submit" in capsys.readouterr().out
    assert len(slurm.scripts) == 2


def test_a_changed_grid_is_not_taken_for_the_same_sweep(slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--spec", "spec.yaml"]) == 0
    assert main(["sweep", "--spec", "spec.yaml", "--grid", "seed=0,1,2"]) == 2
    err = capsys.readouterr().err
    assert "sweep.json lists 4 point(s), this sweep has 6; they differ from point 2 on" in err
    assert "or a new --sweep-name for a new sweep" in err


def test_flags_alone_make_a_sweep(slurm: FakeSlurm, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--grid", "lr=0.1,0.01", "--max-parallel", "1", "--sweep-name", "quick", "--sweep-dir",
                 "out", "--dry-run", "train.py", "epochs=1"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --array=0-1%1\n" in out and f"run_dir={tmp_path}/out/quick/1-lr=0.01" in out
