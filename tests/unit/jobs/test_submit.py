"""submit.py: log folders made before sbatch, Slurm's %x/%j/%% patterns, the training script
looked up where the job runs, submission through a fake SlurmClient, and a Job's logs."""

from __future__ import annotations

import getpass
from pathlib import Path

import pytest
from tests.unit.jobs.conftest import FakeRun, fixture

from torchslurm.errors import ConfigError, SlurmError
from torchslurm.jobs.slurm import SlurmClient
from torchslurm.jobs.slurmoutput import parse_scontrol
from torchslurm.jobs.spec import JobSpec
from torchslurm.jobs.submit import (
    Job,
    expand_pattern,
    filter_rank,
    log_dirs,
    missing_log_dirs,
    new_script,
    prepare,
    script_missing,
    submit,
    unknown_placeholders,
)


@pytest.mark.parametrize(("pattern", "expanded"), [
    ("%x-%j.out", "exp-77.out"),
    ("logs/%x/%%j-%j.out", "logs/exp/%j-77.out"),  # %% is a literal %, so %%j is the text %j
    ("%x-%A_%a-%4t.out", "exp-%A_%a-%4t.out"),  # placeholders only Slurm knows stay for Slurm
    ("100%%.out", "100%.out"),
])
def test_expand_pattern_fills_in_what_is_known(pattern: str, expanded: str) -> None:
    assert expand_pattern(pattern, {"x": "exp", "j": "77"}) == expanded


def test_unknown_placeholders_are_those_left_for_slurm() -> None:
    assert unknown_placeholders("logs/%x/%u/%%j", {"x": "a", "u": "me"}) == []
    assert unknown_placeholders("logs/%j/%N-%5t", {"x": "a"}) == ["%j", "%N", "%5t"]


def test_prepare_places_relative_logs_in_the_run_dir_and_makes_their_folders(tmp_path: Path) -> None:
    spec = JobSpec(script="t.py", name="exp", output="logs/%x/%u/%j.out", error=str(tmp_path / "abs/%x.err"))
    used, script = prepare(spec, tmp_path / "run")
    assert used.output == f"{tmp_path}/run/logs/%x/%u/%j.out"  # Slurm fills the placeholders in
    assert used.error == f"{tmp_path}/abs/%x.err"  # absolute: kept
    assert (tmp_path / "run" / "logs" / "exp" / getpass.getuser()).is_dir() and (tmp_path / "abs").is_dir()
    assert script == tmp_path / "run" / "exp.sbatch"
    assert f"#SBATCH --output={tmp_path}/run/logs/%x/%u/%j.out" in script.read_text()


def test_prepare_refuses_a_folder_named_by_the_job_id(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"^output={tmp_path}/%j/out\.txt: its folder holds a placeholder known "
                                           r"only once the job runs.*HINT: keep %j and the like in the file name"):
        prepare(JobSpec(script="t.py", output="%j/out.txt"), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_prepare_says_why_a_log_folder_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"cannot create .*/file/logs/ \(Not a directory\).*HINT: give a folder"):
        prepare(JobSpec(script="t.py", output=f"{tmp_path}/file/logs/%j.out"), tmp_path / "run")


def test_log_dirs_and_the_missing_ones(tmp_path: Path) -> None:
    spec = JobSpec(script="t.py", output="out/%j.out", error="err/%x/%j.err")
    assert log_dirs(spec, tmp_path) == {"output": tmp_path / "out"}  # err/%x/: Slurm fills it in
    (warning,) = missing_log_dirs(spec, tmp_path)
    assert (warning.severity, warning.code) == ("warning", "log-dir")
    assert warning.hint == f"mkdir -p {tmp_path}/out before sbatch."
    (tmp_path / "out").mkdir()
    assert missing_log_dirs(spec, tmp_path) == []
    assert log_dirs(JobSpec(script="t.py"), tmp_path) == {}  # the default writes into the submit directory


def test_script_missing_looks_where_the_job_runs(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__main__.py").write_text("")
    (tmp_path / "folder").mkdir()
    assert script_missing(JobSpec(script="train.py"), tmp_path, submitting=True) == []
    assert script_missing(JobSpec(script="pkg"), tmp_path, submitting=True) == []  # python runs its __main__.py
    (folder,) = script_missing(JobSpec(script="folder"), tmp_path, submitting=True)
    assert (folder.severity, folder.message) == ("error", f"script 'folder' is a directory: checked {tmp_path}/folder; "
                                                 "the job would wait in the queue and then fail.")
    (printing,) = script_missing(JobSpec(script="gone.py"), tmp_path, submitting=False)
    assert (printing.severity, printing.message) == ("warning", f"script 'gone.py' does not exist: checked "
                                                     f"{tmp_path}/gone.py.")


def test_submit_writes_the_script_and_sbatches_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    run = FakeRun({"sbatch": (0, "42;cluster\n", "")})
    job = submit(JobSpec(script="t.py", name="exp"), client=SlurmClient(run=run))
    assert (job.id, job.script) == ("42", tmp_path / "torchslurm-runs" / "exp" / "exp.sbatch")
    assert job.spec is not None and job.spec.output == f"{tmp_path}/torchslurm-runs/exp/%x-%j.out"
    assert run.calls[-1] == ["sbatch", "--parsable", str(job.script)]


def test_an_unnamed_job_is_named_after_its_script_and_each_submission_writes_its_own_script(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "finetune.py").write_text("")
    run = FakeRun({"sbatch": (0, "42\n", "")})
    first, second = (submit(JobSpec(script="finetune.py"), client=SlurmClient(run=run)) for _ in range(2))
    folder = tmp_path / "torchslurm-runs" / "finetune"
    assert (first.script, second.script) == (folder / "finetune.sbatch", folder / "finetune-2.sbatch")
    assert [call[-1] for call in run.calls if call[0] == "sbatch"] == [str(first.script), str(second.script)]
    assert "#SBATCH --job-name=finetune\n" in second.script.read_text()
    assert JobSpec(script="pkg/").name == "pkg" and JobSpec(script="a.py", name="mine").name == "mine"


def test_a_script_file_is_never_written_twice(tmp_path: Path) -> None:
    """Exclusive creation: a name taken meanwhile (another submission) moves on to the next one."""
    (tmp_path / "exp-2.sbatch").write_text("someone else's")
    made = [new_script(tmp_path, "exp", f"#{n}") for n in range(3)]
    assert [p.name for p in made] == ["exp.sbatch", "exp-3.sbatch", "exp-4.sbatch"]
    assert (tmp_path / "exp-2.sbatch").read_text() == "someone else's"
    assert [p.read_text() for p in made] == ["#0", "#1", "#2"]


def test_submit_refuses_a_job_no_node_of_the_partition_can_hold(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    run = FakeRun({"sbatch": (0, "42\n", "")})
    with pytest.raises(ConfigError, match=r"(?s)error: \[never-starts\] the job asks for 2 node\(s\) with 64 CPUs .*"
                                          r"Nothing was submitted\."):
        submit(JobSpec(script="t.py", nodes=2, gpus_per_node=8, cpus_per_task=8), client=SlurmClient(run=run))
    assert [call[0] for call in run.calls] == ["sinfo"]
    assert submit(JobSpec(script="t.py", nodes=2, gpus_per_node=4), client=SlurmClient(run=run)).id == "42"


def test_submit_refuses_a_spec_with_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    run = FakeRun({"sbatch": (0, "42\n", "")})
    with pytest.raises(ConfigError, match=r"^the job spec has 1 error\(s\):\n  error: \[nccl-without-gpu\] .*\n"
                                          r"Nothing was submitted\. HINT: fix "
                                          r"them \(or pass force=True"):
        submit(JobSpec(script="t.py", backend="nccl"), client=SlurmClient(run=run))
    assert "sbatch" not in [c[0] for c in run.calls] and not (tmp_path / "torchslurm-runs").exists()


def test_the_python_api_refuses_a_missing_script_before_sbatch(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    run = FakeRun({"sbatch": (0, "42\n", "")})
    monkeypatch.chdir(tmp_path)
    spec = JobSpec(script="nothere.py")
    with pytest.raises(ConfigError, match=r"\[script-missing\] script 'nothere.py' does not exist: checked "
                                          rf"{tmp_path}/nothere.py.*force=True from Python"):
        submit(spec, client=SlurmClient(run=run))
    assert "sbatch" not in [c[0] for c in run.calls]
    assert submit(spec, client=SlurmClient(run=run), force=True).id == "42"  # a file only the nodes have
    assert run.calls[-1][0] == "sbatch"


def test_job_wait_uses_clock_and_times_out() -> None:
    running = fixture("scontrol_running.txt")
    run = FakeRun({"scontrol": (0, running, "")})
    now = [0.0]
    job = Job("1", SlurmClient(run=run))
    with pytest.raises(SlurmError, match=r"job 1 still RUNNING after 5 s"):
        job.wait(timeout_s=5, poll_s=1, sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])


def test_logs_by_rank(tmp_path: Path) -> None:
    """One rank's lines: its own file (per_rank_output, found by the pattern sbatch gave srun), else the
    `R: ` labels of srun --label."""
    recorded = fixture("scontrol_completed.txt")
    text = recorded.replace(str(Path(parse_scontrol(recorded)["StdOut"]).parent), str(tmp_path))
    out = tmp_path / "probe-1.out"
    out.write_text("0: rank 0 up\n 1: rank 1 up\n10: rank 10 up\n1: bye\n")
    job = Job("1", SlurmClient(run=FakeRun({"scontrol": (0, text, "")})))
    assert job.logs(1) == "rank 1 up\nbye\n"
    assert filter_rank(out.read_text(), 10) == "rank 10 up\n"
    (tmp_path / "probe-1-rank1.out").write_text("only rank 1\n")
    assert job.rank_log_path(1) == tmp_path / "probe-1-rank1.out" and job.rank_log_path(0) is None
    assert job.logs(1) == "only rank 1\n"
    with pytest.raises(ConfigError, match=r"--rank=-1 is negative\. HINT: ranks count from 0"):
        job.logs(-1)


def test_logs_of_a_rank_the_job_does_not_have_is_an_error_not_an_empty_answer(tmp_path: Path) -> None:
    recorded = fixture("scontrol_completed.txt")  # NumTasks=4
    text = recorded.replace(str(Path(parse_scontrol(recorded)["StdOut"]).parent), str(tmp_path))
    (tmp_path / "probe-1.out").write_text("0: up\n3: up\n")
    job = Job("1", SlurmClient(run=FakeRun({"scontrol": (0, text, "")})))
    assert job.logs(3) == "up\n" and job.logs(2) == ""  # rank 2 printed nothing: a real empty answer
    with pytest.raises(ConfigError, match=r"^--rank=7 but job 1 has 4 task\(s\): ranks 0 to 3\. HINT: pick one"):
        job.logs(7)
