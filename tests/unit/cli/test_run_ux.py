"""Inputs that would fail late in every rank (or with a traceback): each is refused up front, with what
was given, what was expected and a HINT, before any rank starts (also for --dry-run)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import torchslurm.cli as cli_package
from torchslurm.cli import main
from torchslurm.runtime import launch, runchecks

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Run:
    """`torchslurm ARGS…` in tmp_path (which holds ok.py and adir/) on a plain machine; nothing is started:
    launch.execute records its plan and returns 0 (the test fails if a refused input got that far)."""
    for name in [k for k in os.environ if k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.py").write_text("print('ok')\n")
    (tmp_path / "adir").mkdir()
    started: list[Any] = []
    monkeypatch.setattr(launch, "execute", lambda plan, environ, **kw: started.append(plan) or 0)

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        if code != 0:
            assert not started, f"{argv} started ranks before failing"
        assert "Traceback" not in err
        return code, out, err

    return run


# ---- numeric flags of `run` ------------------------------------------------------------

def test_negative_max_restarts_is_refused_before_anything_starts(cli: Run) -> None:
    code, out, err = cli("run", "--max-restarts", "-1", "--nproc", "1", "ok.py")
    assert code == 2 and out == ""
    assert err == ("error: --max-restarts=-1 must be at least 0. HINT: --max-restarts 0 (the default) fails on the "
                   "first error; --max-restarts 3 restarts all ranks up to 3 times.\n")


def test_negative_max_restarts_is_refused_by_dry_run_too(cli: Run) -> None:
    code, out, err = cli("run", "--dry-run", "--max-restarts", "-1", "ok.py")
    assert (code, out) == (2, "") and "--max-restarts=-1 must be at least 0. HINT: --max-restarts 0" in err


def test_every_bad_run_flag_is_named_at_once(cli: Run) -> None:
    code, _, err = cli("run", "--nproc", "0", "--max-restarts", "-2", "nothere.py")
    assert code == 2
    assert err.startswith("error: 3 invalid settings:\n")
    assert "--nproc=0 must be at least 1. HINT: --nproc 2 starts two ranks." in err
    assert "--max-restarts=-2 must be at least 0. HINT:" in err
    assert "script 'nothere.py' does not exist" in err


def test_execute_refuses_negative_max_restarts_from_the_python_api(tmp_path: Path) -> None:
    script = tmp_path / "ok.py"
    script.write_text("")
    plan = launch.LaunchPlan(mode="local", argv=("python", str(script)), nproc=1)
    with pytest.raises(launch.ConfigError, match=r"--max-restarts=-1 must be at least 0\. HINT: --max-restarts 0"):
        launch._run_local(plan, {}, max_restarts=-1)


def test_zero_max_restarts_and_a_script_are_accepted(cli: Run) -> None:
    code, out, _ = cli("run", "--dry-run", "--max-restarts", "0", "--nproc", "1", "ok.py", "--lr", "1")
    assert code == 0 and out.splitlines()[1].endswith(" ok.py --lr 1")


# ---- the script must be a file --------------------------------------------------------

@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_directory_is_not_a_script(cli: Run, dry_run: list[str]) -> None:
    code, out, err = cli("run", *dry_run, "adir")
    assert (code, out) == (2, "")
    assert err == ("error: script 'adir' is a directory without __main__.py; expected a Python file. HINT: give "
                   "the path of the training script, e.g. `torchslurm run --nproc 2 train.py`.\n")


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_missing_script_is_refused_also_by_dry_run(cli: Run, dry_run: list[str]) -> None:
    code, out, err = cli("run", *dry_run, "nothere.py")
    assert (code, out) == (2, "")
    assert err == ("error: script 'nothere.py' does not exist; expected a Python file. HINT: give the path of "
                   "the training script, e.g. `torchslurm run --nproc 2 train.py`.\n")


def test_a_folder_with_main_runs_like_python_runs_it(cli: Run, tmp_path: Path) -> None:
    (tmp_path / "adir" / "__main__.py").write_text("print('ok')\n")
    assert cli("run", "--dry-run", "adir")[0] == 0


# ---- bare `run` -----------------------------------------------------------------------

def test_bare_run_asks_only_for_the_script(cli: Run) -> None:
    code, _, err = cli("run")
    assert code == 2
    assert err == ("error: torchslurm run: the following arguments are required: script. "
                   "HINT: `torchslurm run --help` lists the options.\n")


def test_script_arguments_still_pass_through(cli: Run) -> None:
    code, out, err = cli("run", "--dry-run", "ok.py", "--nproc", "5", "x", "--dry-run=1", "--nproc")
    assert code == 0 and out.splitlines()[1].endswith(" ok.py --nproc 5 x --dry-run=1 --nproc")
    assert err == "".join(
        f"[torchslurm] WARNING {flag} comes after ok.py, so ok.py gets it, not torchslurm run; put it before the "
        f"script (torchslurm run {flag} ... ok.py) unless ok.py takes {flag} itself\n" for flag in ("--nproc",
                                                                                                "--dry-run"))


def test_run_flags_after_the_script_are_told_once_not_by_every_srun_task(cli: Run,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
                        "SLURM_NTASKS": "2", "SLURM_NNODES": "2", "SLURM_STEP_NODELIST": "n[1-2]",
                        "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)"}.items():
        monkeypatch.setenv(name, value)
    code, out, err = cli("run", "--dry-run", "ok.py", "--max-restarts=2")
    assert (code, err) == (0, "") and out.startswith("exec: already a rank: srun task 1 of 2"), (out, err)
    assert runchecks.run_flags_after_script(["--max-restarts", "1", "--nproc=2", "--nproc", "-nproc", "--dry"]) == [
        "--max-restarts", "--nproc"]



# ---- `torchslurm train` settings the ranks would trip over after their start-up ---------

RESUME_HINT = ("HINT: resume=auto continues from the newest checkpoint in run_dir (resume=never starts afresh), "
               "or name one: resume=runs/demo/checkpoints/step-000000100.")


@pytest.mark.parametrize("resume, seen", [
    ("bogus", "no such folder; expected auto, never or a checkpoint folder (a step-N directory written by "
              "torchslurm)."),
    ("/nonexist", "no such folder; expected auto, never or a checkpoint folder"),
    ("ok.py", "is a file, not a folder; expected auto, never or a checkpoint folder"),
    ("adir", "adir has no state.pt or COMPLETE, so it is not a complete torchslurm checkpoint; expected auto, "
             "never or a step-N directory."),
])
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_resume_must_be_auto_never_or_a_checkpoint_folder(cli: Run, resume: str, seen: str,
                                                           dry_run: list[str]) -> None:
    code, out, err = cli("train", *dry_run, f"resume={resume}")
    assert (code, out) == (2, "")
    assert err.startswith(f"error: resume={resume!r}: {seen}") and err.endswith(RESUME_HINT + "\n"), err


def test_resume_takes_a_complete_checkpoint_folder_or_its_state_file(cli: Run, tmp_path: Path) -> None:
    step = tmp_path / "ck" / "step-000000007"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"")
    (step / "COMPLETE").write_text("{}")
    assert cli("train", "--dry-run", f"resume={step}")[0] == 0
    assert cli("train", "--dry-run", f"resume={step / 'state.pt'}")[0] == 0
    assert cli("train", "--dry-run", "resume=never")[0] == 0


def test_fp16_without_a_gpu_is_refused_before_the_ranks_start(cli: Run) -> None:
    code, out, err = cli("train", "--dry-run", "amp=fp16")
    assert (code, out) == (2, "")
    assert err == ("error: amp=fp16 needs CUDA (fp16 with a GradScaler), but the ranks run on cpu (no GPU visible "
                   "here). "
                   "HINT: use amp=bf16 on CPU, or amp=off; or run it on a GPU node.\n")


def test_fp16_with_a_gpu_passes(cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchslurm.runtime import launch

    monkeypatch.setattr(launch, "cuda_device_count", lambda: 2)
    code, out, _ = cli("train", "--dry-run", "amp=fp16")
    assert code == 0 and "2 local rank(s) (one per visible GPU)" in out


def test_mnist_data_dir_must_exist(cli: Run) -> None:
    code, out, err = cli("train", "dataset=mnist", "data_dir=/nonexist")
    assert (code, out) == (2, "")
    assert err == ("error: data_dir=/nonexist does not exist; dataset=mnist reads its files from a directory every "
                   "rank can read. HINT: set data_dir=/path/to/mnist.\n")


@pytest.mark.parametrize("run_dir, what", [("ok.py", "is an existing file"),
                                           ("ok.py/sub", "is inside ok.py, which is a file")])
def test_run_dir_must_not_be_a_file(cli: Run, run_dir: str, what: str) -> None:
    code, out, err = cli("train", f"run_dir={run_dir}")
    assert (code, out) == (2, "")
    assert err == (f"error: run_dir={run_dir} {what}; expected a directory for checkpoints/ and metrics.jsonl. "
                   "HINT: point run_dir at a directory (it is created if missing), e.g. run_dir=runs/demo.\n")


def test_every_path_problem_is_named_at_once(cli: Run) -> None:
    code, _, err = cli("train", "--dry-run", "amp=fp16", "resume=adir", "run_dir=ok.py", "dataset=imagefolder",
                       "data_dir=ok.py")
    assert code == 2 and err.startswith("error: 4 invalid settings:\n"), err
    assert "data_dir=ok.py is not a directory; dataset=imagefolder reads" in err


def test_train_defaults_pass_the_preflight(cli: Run) -> None:
    code, out, _ = cli("train", "--dry-run", "run_dir=new/deeper", "dataset=mnist", "data_dir=adir")
    assert code == 0 and "run_dir=new/deeper" in out


# ---- doctor's --timeout and --nproc ----------------------------------------------------

@pytest.fixture
def doctor_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which way `doctor` went: 'here' (this process) or 'ranks'; neither really runs."""
    from torchslurm.cli import doctor

    calls: list[str] = []
    monkeypatch.setattr(doctor, "check_here", lambda args: calls.append("here") or 0)
    monkeypatch.setattr(doctor, "check_ranks", lambda args: calls.append("ranks") or 0)
    return calls


@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_doctor_timeout_must_be_positive(cli: Run, doctor_calls: list[str], value: str) -> None:
    code, out, err = cli("doctor", "--connect", "--timeout", value)
    assert (code, out, doctor_calls) == (2, "", [])
    assert err == (f"error: --timeout={value} must be a positive number of seconds. HINT: --timeout 30 (the "
                   "default) waits up to 30 s for the other ranks.\n")


def test_doctor_nproc_zero_is_one_error(cli: Run, doctor_calls: list[str]) -> None:
    code, out, err = cli("doctor", "--ranks", "--nproc", "0")
    assert (code, out, doctor_calls) == (2, "", [])
    assert err == "error: --nproc=0 must be at least 1. HINT: --nproc 2 starts two ranks.\n"


def test_doctor_nproc_implies_ranks(cli: Run, doctor_calls: list[str]) -> None:
    assert cli("doctor", "--nproc", "2")[0] == 0
    assert cli("doctor", "--ranks")[0] == 0
    assert cli("doctor", "--connect", "--timeout", "0.5")[0] == 0
    assert doctor_calls == ["ranks", "ranks", "here"]


def test_doctor_help_says_nproc_implies_ranks(cli: Run) -> None:
    code, out, _ = cli("doctor", "--help")
    assert code == 0 and "implies --ranks" in " ".join(out.split())


# ---- bench --json is checked first, and results are never lost -------------------------

BENCH_HINT = "HINT: give a file in an existing folder you can write to, e.g. --json bench.json.\n"


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_bench_json_in_a_missing_folder_is_refused_before_the_benchmark(cli: Run, dry_run: list[str]) -> None:
    code, out, err = cli("bench", *dry_run, "--json", "/nonexistent/x.json", "--nproc", "1")
    assert (code, out) == (2, "")
    assert err == ("error: --json /nonexistent/x.json: the folder /nonexistent does not exist; expected a file in "
                   "an existing folder. " + BENCH_HINT)


def test_bench_json_that_is_a_folder_is_refused(cli: Run) -> None:
    code, out, err = cli("bench", "--json", "adir", "--nproc", "1")
    assert (code, out) == (2, "")
    assert err == "error: --json adir is a directory; expected a file to write the results to. " + BENCH_HINT


def test_bench_json_in_an_existing_folder_is_accepted(cli: Run) -> None:
    assert cli("bench", "--dry-run", "--json", "adir/out.json", "--nproc", "1")[0] == 0


def test_bench_results_are_printed_when_writing_them_fails(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from torchslurm.cli import bench

    target = tmp_path / "gone" / "x.json"  # its folder vanished after the check
    assert bench._write_json(target, '{"results": []}\n') == 1
    out, err = capsys.readouterr()
    assert out == '{"results": []}\n'
    assert err == (f"error: --json {target}: cannot write the results (No such file or directory); they are "
                   "printed above as JSON instead. " + BENCH_HINT)


def test_run_dash_m_plans_a_module(cli: Run) -> None:
    code, out, _ = cli("run", "--dry-run", "--nproc", "1", "-m", "torchslurm.cli.doctor", "--json")
    assert code == 0 and out.splitlines()[1].endswith(" -m torchslurm.cli.doctor --json")


def test_bench_ranks_start_by_module_name(cli: Run) -> None:
    code, out, _ = cli("bench", "--dry-run", "--nproc", "1")
    assert code == 0 and " -m torchslurm.cli.bench --sizes " in out.splitlines()[1]


def test_a_run_dir_that_cannot_be_created_is_refused_even_where_permission_bits_say_yes(cli: Run) -> None:
    """/proc answers os.access(W_OK) for root, yet nothing can be created in it."""
    code, out, err = cli("train", "--dry-run", "run_dir=/proc/foo")
    assert (code, out) == (2, "")
    assert err.startswith("error: run_dir=/proc/foo cannot be created (No such file or directory: /proc/foo); "
                          "checkpoints/ and metrics.jsonl are written there. HINT: choose a directory you can write to")


def test_a_dry_run_leaves_no_run_dir_behind(cli: Run, tmp_path: Path) -> None:
    code, _, _ = cli("train", "--dry-run", f"run_dir={tmp_path / 'a' / 'b'}")
    assert code == 0 and not (tmp_path / "a").exists()

# ---- the end of the program -------------------------------------------------------------


def test_the_program_ends_its_own_process_and_a_call_from_python_returns(cli: Run, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ended: list[int] = []
    monkeypatch.setattr(cli_package, "exit_process", ended.append)
    assert cli("run", "--dry-run", "ok.py")[0] == 0 and ended == []
    monkeypatch.setattr(sys, "argv", ["torchslurm", "run", "--dry-run", "ok.py"])
    assert main() == 0 and ended == [0]
    monkeypatch.setattr(sys, "argv", ["torchslurm", "run", "missing.py"])
    assert main() == 2 and ended == [0, 2]
    monkeypatch.setattr(sys, "argv", ["torchslurm", "train", "--dry-run", f"run_dir={tmp_path / 'r'}"])
    assert main() == 0 and ended == [0, 2, 0]  # every command, not only run


def test_in_a_container_without_srun_the_batch_shell_is_told_to_start_the_ranks_outside(tmp_path: Path) -> None:
    """The real command in an allocation's batch shell inside an Apptainer container, where srun is missing."""
    import subprocess

    (tmp_path / "train.py").write_text("print('trained')\n")
    environ = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path), "SLURM_JOB_ID": "77",
               "SLURM_NNODES": "2", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "node[1-2]",
               "SLURM_TASKS_PER_NODE": "1(x2)", "APPTAINER_CONTAINER": "/images/pt.sif"}
    done = subprocess.run([sys.executable, "-m", "torchslurm", "run", "train.py"], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.endswith(
        "error: cannot start 'srun' inside the container /images/pt.sif: No such file or directory. HINT: start the "
        "ranks from outside it, one container per task: `srun apptainer exec --nv IMAGE "
        "torchslurm run train.py` in the batch script (each task then runs as one rank).\n"), done.stderr
    assert "trained" not in done.stdout

