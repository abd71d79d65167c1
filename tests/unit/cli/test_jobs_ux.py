"""Job submission UX: Slurm's flag names, missing scripts and log directories, preemption flags, cancel signals."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest

from torchslurm.cli import build_parser, main


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _parsers(sub)
    return out


def test_no_parser_accepts_abbreviated_flags() -> None:
    parsers = _parsers(build_parser())
    assert len(parsers) > 10
    assert [p.prog for p in parsers if p.allow_abbrev] == []


def test_an_abbreviation_of_a_spec_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["script", "--gpus-per", "8", "t.py"], capsys)
    assert err.startswith("error: torchslurm script: unrecognized arguments: --gpus-per. HINT:"), err


@pytest.mark.parametrize("argv, expected", [
    (["script", "--nodes", "2", "--gpus", "8", "train.py"],
     "error: torchslurm script: --gpus is Slurm's GPU count for the whole job; torchslurm asks per node. "
     "HINT: use --gpus-per-node N (the job gets --nodes x N GPUs), e.g. --nodes 2 --gpus-per-node 4 for 8 GPUs.\n"),
    (["script", "--gpus=8", "train.py"], "error: torchslurm script: --gpus is Slurm's GPU count"),
    (["submit", "-G", "8", "train.py"], "error: torchslurm submit: -G is Slurm's GPU count"),
    (["script", "--cpus", "4", "train.py"],
     "error: torchslurm script: --cpus is not a Slurm or torchslurm flag; CPUs are asked per task. "
     "HINT: use --cpus-per-task N.\n"),
    (["script", "--ntasks-per-node", "4", "train.py"],
     "error: torchslurm script: --ntasks-per-node is spelled --tasks-per-node in torchslurm. "
     "HINT: use --tasks-per-node N.\n"),
    (["script", "--ntasks", "8", "train.py"], "--ntasks is Slurm's task count for the whole job; torchslurm asks "
     "per node. HINT: use --tasks-per-node N (the job gets --nodes x N tasks)"),
    (["script", "-n4", "train.py"], "error: torchslurm script: -n is Slurm's task count for the whole job"),
    (["submit", "--job-name", "x", "train.py"],
     "error: torchslurm submit: --job-name is spelled --name in torchslurm (rendered as #SBATCH --job-name). "
     "HINT: use --name NAME.\n"),
    (["script", "--mem-per-gpu", "40G", "train.py"],
     "--mem-per-gpu is not a job spec field; torchslurm asks memory per node. HINT: use --mem SIZE per node"),
    (["script", "-t", "10", "train.py"], "-t is sbatch's short form of --time. HINT: use --time.\n"),
    (["script", "--export", "A=1", "train.py"], "HINT: use --env NAME=VALUE (repeatable).\n"),
    (["script", "--reservation=maint", "train.py"],
     "error: torchslurm script: --reservation is an sbatch option that the job spec has no field for (nor one "
     "for raw sbatch options). HINT: render the script (`torchslurm script ... > job.sbatch`), then "
     "`sbatch --reservation=... job.sbatch`"),
])
def test_slurms_own_flag_names_say_which_torchslurm_flag_to_use(argv: list[str], expected: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(argv, capsys)
    assert expected in err and err.count("HINT:") == 1, err


def test_slurm_advice_only_where_the_subcommand_has_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["logs", "1", "-o", "x"], capsys)
    assert err.startswith("error: torchslurm logs: unrecognized arguments: -o x. HINT: `torchslurm logs --help`"), err


MASTER_FOUND = ("is torchrun's; torchslurm finds the master (the node of rank 0) and a free port itself. HINT: drop "
                "it; to choose them anyway, set MASTER_ADDR and MASTER_PORT in the environment.\n")


@pytest.mark.parametrize("argv, expected", [
    (["run", "--nproc_per_node", "2", "train.py"], "error: torchslurm run: --nproc_per_node is torchrun's spelling "
     "of --nproc. HINT: use --nproc N (ranks on this machine; per node inside an allocation).\n"),
    (["train", "--nproc-per-node=2"], "error: torchslurm train: --nproc-per-node is torchrun's spelling of --nproc. "),
    (["run", "--standalone", "--nproc", "2", "train.py"],
     "error: torchslurm run: --standalone is torchrun's; torchslurm picks a free local port itself. HINT: drop it.\n"),
    (["run", "--nnodes=2", "train.py"], "error: torchslurm run: --nnodes is torchrun's; torchslurm spans the Slurm "
     "allocation it runs in (every node of it) and this machine alone outside one. HINT: drop it; for N nodes, run "
     "it inside `salloc -N N` or an sbatch script, or submit with `torchslurm submit --nodes N`.\n"),
    (["run", "--master_port=29500", "train.py"], f"error: torchslurm run: --master_port {MASTER_FOUND}"),
    (["doctor", "--rdzv-endpoint", "node1:29500"], f"error: torchslurm doctor: --rdzv-endpoint {MASTER_FOUND}"),
    (["bench", "--node_rank=0"], f"error: torchslurm bench: --node_rank {MASTER_FOUND}"),
])
def test_torchruns_own_flags_say_what_torchslurm_does_instead(argv: list[str], expected: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(argv, capsys)
    assert err.endswith(expected) if expected.endswith("\n") else expected in err, err


def test_torchrun_advice_only_where_the_subcommand_starts_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    """submit has --nproc-per-node of its own (torchrun mode): --nproc_per_node is a near miss there."""
    err = _error(["submit", "--nproc_per_node", "2", "train.py"], capsys)
    assert err.startswith("error: torchslurm submit: unrecognized arguments: --nproc_per_node. HINT: did you mean "
                          "--nproc_per_node -> --nproc-per-node?"), err
    err = _error(["script", "--standalone", "train.py"], capsys)
    assert err.startswith("error: torchslurm script: unrecognized arguments: --standalone. HINT:"), err


@pytest.fixture
def no_sbatch(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """SlurmClient.submit records the script instead of running sbatch; job id 42."""
    submitted: list[Path] = []

    def submit(self: object, script: Path, cwd: Path | None = None) -> str:
        submitted.append(script)
        return "42"

    monkeypatch.setattr("torchslurm.jobs.slurm.SlurmClient.submit", submit)
    return submitted


def test_submit_refuses_a_missing_training_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  no_sbatch: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["submit", "nothere.py"]) == 2
    err = capsys.readouterr().err
    assert (f"error: [script-missing] script 'nothere.py' does not exist: checked {tmp_path}/nothere.py; the job "
            f"would wait in the queue and then fail. HINT: give the training script's path (relative paths are "
            f"taken from {tmp_path}, where the job runs); if it exists only on the compute nodes, pass --force"
            ) in err
    assert no_sbatch == []
    assert main(["submit", "--force", "nothere.py"]) == 0 and len(no_sbatch) == 1  # only on the nodes: forced


@pytest.mark.parametrize(("given", "text", "kind"), [
    ("job.sh", "srun python train.py\n", "a .sh file"),
    ("run.SBATCH", "#SBATCH -N 2\n", "a .sbatch file"),
    ("job", "#!/usr/bin/env bash\n#SBATCH --nodes=2\nsrun python train.py\n", "a shell script (#!/usr/bin/env bash)"),
])
def test_submit_refuses_a_hand_written_sbatch_script_given_as_the_training_script(
        given: str, text: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_sbatch: list[Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    """`submit job.sh`: the user's own sbatch script, which the job would run with python."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / given).write_text(text)
    assert main(["submit", given]) == 2
    assert (f"error: [script-is-shell] script {given!r} is {kind}: the job would run `python {given}` and fail at "
            "once. HINT: give the Python training script: torchslurm writes the sbatch script around it "
            f"(`torchslurm script` shows it); to submit a script of your own, run `sbatch {given}` (and check it "
            f"first with `torchslurm lint {given}`)\n") in capsys.readouterr().err
    assert no_sbatch == []
    assert main(["script", given]) == 0 and "warning: [script-is-shell]" in capsys.readouterr().err
    assert main(["run", given]) == 2
    assert (f"error: script {given!r} is {kind}, not a Python script: `python {given}` would fail. HINT: give the "
            "Python training script (`torchslurm run --nproc 2 train.py`); a hand-written sbatch script is submitted "
            f"with `sbatch {given}` (check it first: `torchslurm lint {given}`).") in capsys.readouterr().err


@pytest.mark.parametrize("given", ["job.yaml", "job.YML", "config.json", "settings.toml"])
def test_submit_refuses_a_job_spec_given_as_the_training_script(given: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                no_sbatch: list[Path],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`submit job.yaml` for `submit --spec job.yaml`: the file exists, but python cannot run it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / given).write_text("script: train.py\n")
    assert main(["submit", given]) == 2
    err = capsys.readouterr().err
    kind = {"yaml": "YAML", "yml": "YAML", "json": "JSON", "toml": "TOML"}[given.rsplit(".", 1)[1].lower()]
    assert (f"error: [script-is-config] script {given!r} is a {kind} file: the job would run `python {given}` and "
            f"fail at once. HINT: a job spec goes after --spec (`--spec {given}`)") in err
    assert no_sbatch == []
    assert main(["script", given]) == 0 and "warning: [script-is-config]" in capsys.readouterr().err
    assert main(["run", given]) == 2
    assert (f"error: script {given!r} is a {kind} file, not a Python script: `python {given}` would fail. HINT: give "
            f"the training script first and this file among its arguments") in capsys.readouterr().err


def test_script_warns_about_a_missing_training_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["script", "nothere.py"]) == 0
    out, err = capsys.readouterr()
    assert "python nothere.py" in out
    assert (f"warning: [script-missing] script 'nothere.py' does not exist: checked {tmp_path}/nothere.py. HINT: "
            "give the training script's path; relative paths are taken from the directory you run sbatch in") in err
    (tmp_path / "train.py").write_text("")
    assert main(["script", "train.py"]) == 0 and "script-missing" not in capsys.readouterr().err


def test_script_warns_about_a_missing_log_directory_like_lint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    assert main(["script", "--output", f"{tmp_path}/none/dir/%j.out", "--error", "logs/%x/%j.err", "t.py"]) == 0
    err = capsys.readouterr().err
    assert (f"warning: [log-dir] --output={tmp_path}/none/dir/%j.out: Slurm does not create {tmp_path}/none/dir/; "
            f"if it is missing the job fails before printing anything. HINT: mkdir -p {tmp_path}/none/dir before "
            "sbatch") in err
    assert "--error" not in err  # %x: Slurm fills it in; lint does not judge it either
    (tmp_path / "none" / "dir").mkdir(parents=True)
    assert main(["script", "--output", f"{tmp_path}/none/dir/%j.out", "t.py"]) == 0
    assert "log-dir" not in capsys.readouterr().err


def test_submit_creates_the_log_directory_or_says_why_it_cannot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                no_sbatch: list[Path],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    (tmp_path / "a-file").write_text("")
    assert main(["submit", "--output", f"{tmp_path}/a-file/logs/%j.out", "t.py"]) == 2
    assert capsys.readouterr().err == (
        f"error: output={tmp_path}/a-file/logs/%j.out: cannot create {tmp_path}/a-file/logs/ (Not a directory); "
        "Slurm does not create it and the job would fail before printing anything. HINT: give a folder you can "
        "write, e.g. output=logs/%x-%j.out (placed in the run directory).\n")
    assert no_sbatch == []
    assert main(["submit", "--output", f"{tmp_path}/new/logs/%j.out", "t.py"]) == 0
    assert (tmp_path / "new" / "logs").is_dir() and len(no_sbatch) == 1
    assert main(["submit", "--name", "exp1", "--output", f"{tmp_path}/%x/%%done/%j.out", "t.py"]) == 0
    assert (tmp_path / "exp1" / "%done").is_dir() and len(no_sbatch) == 2  # %x is the job name; %% a %
    assert main(["submit", "--output", f"{tmp_path}/%j/out.txt", "t.py"]) == 2
    assert "its folder holds a placeholder known only once the job runs" in capsys.readouterr().err
    assert len(no_sbatch) == 2 and not (tmp_path / "%j").exists()


def test_preemption_flags_turn_on_preemptible_and_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    assert main(["script", "--requeue", "--signal", "USR1", "--grace-s", "300", "--max-requeues", "5", "t.py"]) == 0
    out, err = capsys.readouterr()
    assert "#SBATCH --signal=USR1@300\n" in out and "#SBATCH --requeue\n" in out
    assert "export TORCHSLURM_MAX_REQUEUES=5\n" in out
    assert ("info: [preemptible-implied] --signal, --grace-s, --requeue, --max-requeues turned on --preemptible: "
            "the script asks for --signal=USR1@300, --requeue and --open-mode=append. HINT: pass --preemptible "
            "to say so, or drop --signal, --grace-s, --requeue, --max-requeues for a job that is not preemptible"
            ) in err
    assert main(["script", "--preemptible", "--signal", "USR1", "t.py"]) == 0
    assert "preemptible-implied" not in capsys.readouterr().err


def test_preemption_flags_where_preemptible_is_off_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    assert main(["script", "--no-preemptible", "--signal", "USR1", "t.py"]) == 0
    out, err = capsys.readouterr()
    assert "--signal" not in out
    assert ("warning: [preemption-off] --signal takes effect only for a preemptible job, and preemptible is off; "
            "the script has no #SBATCH --signal or --requeue. HINT: pass --preemptible (preemptible: true in the "
            "spec file), or drop them") in err
    (tmp_path / "s.yaml").write_text("script: t.py\npreemptible: false\ngrace_s: 200\n")
    assert main(["script", "--spec", "s.yaml", "--no-requeue"]) == 0
    assert "warning: [preemption-off] grace_s (in s.yaml), --no-requeue take effect only" in capsys.readouterr().err


def _help(command: str, flag: str) -> str:
    sub = next(p for p in _parsers(build_parser()) if p.prog == f"torchslurm {command}")
    return str(sub._option_string_actions[flag].help)


@pytest.mark.parametrize("command", ["script", "submit"])
@pytest.mark.parametrize("flag", ["--signal", "--grace-s", "--requeue", "--max-requeues"])
def test_the_help_of_preemption_flags_says_they_turn_it_on(command: str, flag: str) -> None:
    assert _help(command, flag).endswith(" Given as a flag, it turns on --preemptible (unless --no-preemptible).")


@pytest.fixture
def cancels(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    calls: list[tuple[str, str | None]] = []
    monkeypatch.setattr("torchslurm.jobs.slurm.SlurmClient.cancel",
                        lambda self, job, signal=None: calls.append((job, signal)))
    return calls


def test_cancel_checks_the_signal_before_scancel(cancels: list[tuple[str, str | None]],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cancel", "123", "--signal", "FOO"]) == 2
    assert capsys.readouterr().err == (
        "error: --signal='FOO' is not a signal scancel knows. HINT: use one of HUP, INT, QUIT, ABRT, KILL, ALRM, "
        "TERM, USR1, USR2, URG, CONT, STOP, TSTP, TTIN, TTOU, XCPU (SIG prefix optional) or a signal number; a "
        "preemptible job checkpoints and stops on its spec's signal (USR2 by default).\n")
    assert main(["cancel", "123", "--signal", "0"]) == 2 and cancels == []
    assert main(["cancel", "123", "--signal", "sigusr2"]) == 0
    assert main(["cancel", "123", "--signal", "10"]) == 0
    assert main(["cancel", "123"]) == 0
    assert cancels == [("123", "USR2"), ("123", "10"), ("123", None)]
    assert capsys.readouterr().out == "job 123: sent USR2\njob 123: sent 10\njob 123: cancel requested\n"


@pytest.mark.parametrize("value", ["²", "٣", "1" * 5000])
def test_cancel_refuses_a_signal_in_other_digits(value: str, cancels: list[tuple[str, str | None]],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`²`.isdigit() is true and int('²') raised; `٣` was read as signal 3 (QUIT), which scancel would not know."""
    assert main(["cancel", "123", "--signal", value]) == 2 and cancels == []
    assert capsys.readouterr().err.startswith(f"error: --signal='{value[:20]}")


@pytest.mark.parametrize("command", ["status", "logs", "cancel", "script", "submit"])
def test_job_commands_have_a_description(command: str) -> None:
    sub = next(p for p in _parsers(build_parser()) if p.prog == f"torchslurm {command}")
    assert sub.description and len(sub.description) > 60, command


@pytest.mark.parametrize("flag, listed", [("--launch", "{srun,torchrun}"), ("--backend", "{auto,gloo,nccl}"),
                                          ("--gpu-flag", "{gpus-per-node,gres}"),
                                          ("--signal", "{USR1,USR2,TERM,INT,HUP,URG}")])
def test_help_lists_the_choices(flag: str, listed: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["submit", "--help"])
    assert f"  {flag} {listed}\n" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["script"], ["script", "--nodes", "2", "--name", "a b"], ["submit", "--nodes", "2"]])
def test_no_script_hint_quotes_the_command_that_was_run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    command = shlex.join(["torchslurm", *argv])
    assert capsys.readouterr().err == (f"error: no `script` in flags. HINT: give the training script after the flags "
                                       f"(`{command} train.py`) or as `script: train.py` in the --spec file.\n")


def test_spec_errors_name_flags_as_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    assert main(["script", "--gpus-per-node=-2", "--nodes", "0", "t.py"]) == 2
    assert capsys.readouterr().err == (
        "error: 2 invalid settings:\n"
        "  --nodes=0 must be at least 1. HINT: set --nodes to 1 or more.\n"
        "  --gpus-per-node=-2 must be at least 0. HINT: set --gpus-per-node to 0 or more.\n")
    assert main(["script", "--gpus-per-node", "4", "--tasks-per-node", "1", "t.py"]) == 2
    assert ("error: [tasks-vs-gpus] --launch=srun runs one rank per Slurm task, but --tasks-per-node=1 and "
            "--gpus-per-node=4. HINT: set --tasks-per-node 4, or use --launch torchrun with --tasks-per-node 1."
            ) in capsys.readouterr().err
    assert main(["script", "--preemptible", "--no-requeue", "--time", "10", "t.py"]) == 0
    assert ("warning: [no-requeue] preemptible with --no-requeue: after the checkpoint the job ends instead of "
            "continuing. HINT: set --requeue.") in capsys.readouterr().err


def test_spec_errors_name_spec_file_keys_as_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    (tmp_path / "job.yaml").write_text("script: t.py\ngpus_per_node: 4\nnodes: 0\n")
    assert main(["script", "--spec", "job.yaml", "--gpus-per-node=-2"]) == 2
    assert capsys.readouterr().err == (
        "error: 2 invalid settings:\n"
        "  nodes=0 must be at least 1. HINT: set nodes to 1 or more.\n"
        "  --gpus-per-node=-2 must be at least 0. HINT: set --gpus-per-node to 0 or more.\n")
    (tmp_path / "job.yaml").write_text("script: t.py\ngpus_per_node: 4\nbackend: gloo\n")
    assert main(["script", "--spec", "job.yaml", "--tasks-per-node", "1"]) == 2
    err = capsys.readouterr().err
    assert ("but --tasks-per-node=1 and gpus_per_node=4. HINT: set --tasks-per-node 4, or use --launch torchrun "
            "with --tasks-per-node 1.") in err
    assert ("warning: [gloo-with-gpu] backend=gloo with gpus_per_node=4: gradients go through CPU memory, much "
            "slower than NCCL. HINT: use backend: auto (NCCL on GPUs).") in err  # set in the file: a key


def test_the_spec_file_is_read_once_per_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from torchslurm.jobs import spec as jobspec

    reads: list[Path] = []
    read_file = jobspec.read_file
    monkeypatch.setattr(jobspec, "read_file", lambda path: reads.append(path) or read_file(path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    (tmp_path / "s.yaml").write_text("script: t.py\npreemptible: false\ngrace_s: 200\n")
    assert main(["script", "--spec", "s.yaml", "--no-requeue", "--nodes", "0"]) == 2  # an invalid spec
    assert main(["script", "--spec", "s.yaml", "--no-requeue"]) == 0  # preemption-off names the file's keys
    assert "grace_s (in s.yaml), --no-requeue take effect only" in capsys.readouterr().err
    assert reads == [Path("s.yaml"), Path("s.yaml")]


def test_spec_flags_show_the_field_help() -> None:
    assert _help("script", "--nodes") == "Number of nodes (`--nodes`)."
    assert _help("submit", "--output") == "stdout file pattern of the job (`--output`); `%%x` job name, `%%j` job id."


def _recorded_status(name: str) -> object:
    from torchslurm.jobs.slurmoutput import parse_scontrol, status_from_scontrol

    return status_from_scontrol(parse_scontrol((Path(__file__).parents[2] / "fixtures" / "slurm_output" / name)
                                               .read_text()))


def test_status_says_a_pending_reason_in_words(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("torchslurm.jobs.slurm.SlurmClient.status", lambda self, job: _recorded_status(
        "scontrol_held.txt"))
    assert main(["status", "26"]) == 0
    said = capsys.readouterr().out
    assert "  reason:   JobHeldUser (held by its owner: `scontrol release JOB` lets it start)\n" in said


def test_status_shows_the_nodes_a_job_excludes(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("torchslurm.jobs.slurm.SlurmClient.status", lambda self, job: _recorded_status(
        "scontrol_excluded.txt"))
    assert main(["status", "31"]) == 0
    assert "  excluded: node[3-4] (ExcNodeList: --exclude, or nodes a node-level failure took out)\n" in \
        capsys.readouterr().out
    monkeypatch.setattr("torchslurm.jobs.slurm.SlurmClient.status", lambda self, job: _recorded_status(
        "scontrol_held.txt"))
    assert main(["status", "26"]) == 0
    assert "excluded" not in capsys.readouterr().out


def test_cancel_of_a_job_that_already_ended_says_so(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("torchslurm.jobs.slurm.SlurmClient.cancel", lambda self, job, signal=None: _recorded_status(
        "scontrol_cancelled.txt"))
    assert main(["cancel", "2"]) == 0
    assert capsys.readouterr().out == "job 2 had already ended (CANCELLED): nothing to cancel\n"


def test_a_shell_not_pointed_at_a_running_sandbox_is_told_to_source_its_env_sh(tmp_path: Path) -> None:
    from torchslurm.cli.sandbox import unpointed_shell_hint
    from torchslurm.errors import SlurmError
    from torchslurm.sandbox.config import SandboxConfig, state_json

    cfg = SandboxConfig(lab_dir=tmp_path, python_bin=tmp_path / "bin")
    (tmp_path / "sandbox.json").write_text(state_json(cfg))
    no_controller = SlurmError("squeue failed (1): squeue: fatal: Could not establish a configuration source.",
                               "generic")
    better = unpointed_shell_hint(no_controller, {}, lab_dir=lambda: tmp_path)
    assert (better.message, better.hint) == (no_controller.message, (
        f"a sandbox cluster is up in {tmp_path}, but this shell is not pointed at it: run `source "
        f"{tmp_path}/env.sh` (it sets SLURM_CONF and PATH), then retry."))
    pointed = {"SLURM_CONF": str(cfg.slurm_conf)}
    assert unpointed_shell_hint(no_controller, pointed, lab_dir=lambda: tmp_path) is no_controller
    assert unpointed_shell_hint(no_controller, {}, lab_dir=lambda: None) is no_controller  # no sandbox up
    other = SlurmError("job 5 is unknown to Slurm.", "generic")
    assert unpointed_shell_hint(other, {}, lab_dir=lambda: tmp_path) is other


def test_status_names_the_stragglers_of_the_jobs_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from torchslurm.jobs.rundir import remember
    from torchslurm.train.stragglers import STRAGGLERS_FILE, RankTiming, Straggler, gather_record

    monkeypatch.setattr("torchslurm.jobs.slurm.SlurmClient.status", lambda self, job: _recorded_status(
        "scontrol_running.txt"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    remember(run_dir, {"HOME": str(tmp_path / "home"), "SLURM_JOB_ID": "1"})  # what the job's rank 0 does
    assert main(["status", "1"]) == 0
    assert f"  run_dir:  {run_dir}\n" in capsys.readouterr().out  # no stragglers file yet
    timing = [RankTiming(50, 8.0, 0.0, 3.0)] * 12 + [RankTiming(50, 8.0, 0.0, 0.0)] * 4
    named = [Straggler((12, 13, 14, 15), "node3", 1.6, True)]
    (run_dir / STRAGGLERS_FILE).write_text(json.dumps(gather_record(1200, timing, named, 200)))
    assert main(["status", "1"]) == 0
    assert "  straggler: node3 (ranks 12-15) 1.6× the median compute time for the last 200 steps (step 1200)\n" \
        in capsys.readouterr().out
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    (healthy / STRAGGLERS_FILE).write_text(json.dumps(gather_record(300, timing[:2], [], 200)))
    assert main(["status", "1", "--run-dir", str(healthy)]) == 0
    assert "  stragglers: none (step 300)\n" in capsys.readouterr().out
