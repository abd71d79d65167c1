"""lint(): every pitfall of the classic scripts in tests/fixtures/seed_scripts is flagged; our own
rendered scripts are clean."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from torchslurm.cli import main
from torchslurm.jobs.sbatch import render
from torchslurm.jobs.spec import JobSpec
from torchslurm.lint.checks import lint, parse
from torchslurm.lint.directives import edit_distance

FIXTURES = Path(__file__).parents[2] / "fixtures"
SEEDS = FIXTURES / "seed_scripts"
C10D = "--rdzv-backend=c10d --rdzv-endpoint=$h:$p"  # the rendezvous torchrun needs across nodes

# What each seed script gets wrong, by the seed's own text (see the fixture headers).
EXPECTED = {
    "seed000_pytorch_distributed.sbatch": {"hard-coded-master-addr", "fixed-master-port", "batch-shell-rank",
                                           "no-kill-on-bad-exit"},
    "seed002_run_distributed.slurm": {"fixed-port", "log-dir", "no-kill-on-bad-exit"},
    "seed003_ex1_single_gpu.sbatch": {"launcher-without-srun", "deprecated-launch"},
    "seed003_ex2_multi_gpu.sbatch": {"ntasks-mismatch", "launcher-without-srun", "deprecated-launch"},
    "seed003_ex3_process_split.sbatch": {"launcher-without-srun", "deprecated-launch"},
    "seed004_run_nccl.slurm": {"hard-coded-master-addr", "fixed-master-port", "per-rank-nic",
                               "nccl-ib-disabled", "no-kill-on-bad-exit"},
    "lab_signal_batch_only.sbatch": {"signal-unreachable", "export-none-bare-python", "signal-without-requeue",
                                     "no-kill-on-bad-exit"},
    "lab_torchrun_signal.sbatch": {"signal-kills-torchrun", "no-kill-on-bad-exit"},
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


def test_tasks_vs_gpus_under_srun() -> None:
    text = "#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1\n#SBATCH --gpus-per-node=4\nsrun -K python train.py\n"
    assert [f.code for f in lint(text)] == ["tasks-vs-gpus"]


def test_nproc_vs_gpus_and_launcher_per_task() -> None:
    text = ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=4 --gres=gpu:a100:4\n"
            "srun --kill-on-bad-exit=1 torchrun --nproc_per_node=2 --nnodes=2 " + C10D + " train.py\n")
    assert {f.code for f in lint(text)} == {"launcher-per-task", "nproc-vs-gpus"}


@pytest.mark.parametrize(("srun", "tasks", "flagged"), [
    ("srun", "--ntasks=4", True), ("srun --kill-on-bad-exit=0", "--ntasks=4", True), ("srun -K0", "-N 2", True),
    ("srun --kill-on-bad-exit=1", "--ntasks=4", False), ("srun --kill-on-bad-exit", "--ntasks=4", False),
    ("srun -K", "-N 2", False), ("srun -K1 --label", "--ntasks=4", False),
    ("srun", "--ntasks=1", False),  # one rank: nobody waits for it
])
def test_srun_without_kill_on_bad_exit_leaves_the_survivors_waiting(srun: str, tasks: str, flagged: bool) -> None:
    text = f"#!/bin/bash\n#SBATCH {tasks}\n{srun} python train.py\n"
    found = [f for f in lint(text) if f.code == "no-kill-on-bad-exit"]
    assert bool(found) is flagged
    if found:
        assert found[0].message.startswith("line 3: srun without --kill-on-bad-exit") and "30 min" in found[0].message
        assert "srun --kill-on-bad-exit=1" in found[0].hint


def test_python_without_srun() -> None:
    text = "#!/bin/bash\n#SBATCH --ntasks=4\npython -u train.py\n"
    assert [f.code for f in lint(text)] == ["python-without-srun"]


def test_directives_after_first_command_are_ignored_like_sbatch() -> None:
    script = parse("#!/bin/bash\n#SBATCH --nodes=2\necho hi\n#SBATCH --nodes=8\n")
    assert script.directives == {"nodes": "2"}



def test_log_dir_checked_with_path_exists() -> None:
    text = "#!/bin/bash\n#SBATCH --output=logs/%j.out\nsrun python t.py\n"
    assert [f.code for f in lint(text, path_exists=lambda p: p != "logs")] == ["log-dir"]
    assert lint(text, path_exists=lambda p: True) == []


GPU_JOB = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=4 --gpus-per-node=4\n"


@pytest.mark.parametrize("srun", ["srun --kill-on-bad-exit=1", "srun -K1", "srun --kill-on-bad-exit", "srun -K",
                                  "srun --label -K", "srun --ntasks-per-node 4 -K"])
@pytest.mark.parametrize("command", ['bash -c "python train.py"',
                                     'bash -c "cd /x && python train.py \\\n --lr 0.1"',
                                     "bash -c '\n  cd /x\n  python train.py --lr 0.1\n'",
                                     "python train.py --lr 0.1"])
def test_srun_wrapping_a_shell_keeps_its_options(srun: str, command: str) -> None:
    assert [str(f) for f in lint(f"{GPU_JOB}{srun} {command}\n")] == []


def test_srun_wrapping_a_shell_without_kill_on_bad_exit_still_warned() -> None:
    (f,) = lint(GPU_JOB + 'srun -K0 bash -c "cd /x && python train.py"\n')
    assert f.code == "no-kill-on-bad-exit" and f.message.startswith("line 3: srun without --kill-on-bad-exit")


def test_python_outside_the_srun_string_still_flagged() -> None:
    (f,) = lint(GPU_JOB + 'srun -K bash -c "echo start" && python train.py\n')
    assert f.code == "python-without-srun" and f.message.startswith("line 3: `python ...` runs once")


def test_srun_value_in_the_next_word_is_not_the_command() -> None:
    (f,) = lint(GPU_JOB + "srun --ntasks-per-node 4 python train.py\n")
    assert f.code == "no-kill-on-bad-exit"


@pytest.mark.parametrize("srun", ["srun -K --ntasks-per-node=1", "srun -K -n $SLURM_NNODES --ntasks-per-node=1",
                                  "srun -K --ntasks=2"])
def test_launcher_per_node_as_the_hint_says_is_clean(srun: str) -> None:
    assert lint(f"{GPU_JOB}{srun} torchrun --nproc-per-node=4 --nnodes=2 {C10D} train.py\n") == []


@pytest.mark.parametrize(("directive", "message", "hint"), [
    ("--time=abc", "line 2: #SBATCH --time=abc is not a Slurm time limit; sbatch refuses the script.",
     "#SBATCH --time=1:30:00 (minutes, H:MM:SS or D-HH:MM:SS)."),
    ("--nodes=-1", "line 2: #SBATCH --nodes=-1 is not a node count; Slurm reads the leading `-` as a MIN-MAX "
     "range without MIN, i.e. 1 node.", "#SBATCH --nodes=2 (at least 1), or a range: --nodes=2-4."),
    ("-N 4-2", "line 2: #SBATCH --nodes=4-2 is not a node count; sbatch refuses the script.", "--nodes=2-4"),
    ("--ntasks=0", "line 2: #SBATCH --ntasks=0 is not a whole number of at least 1; sbatch refuses the script.",
     "#SBATCH --ntasks=4."),
    ("--ntasks-per-node 4x", "line 2: #SBATCH --ntasks-per-node=4x is not a whole number", "--ntasks-per-node=4"),
    ("-c -1", "line 2: #SBATCH --cpus-per-task=-1 is not a whole number", "#SBATCH --cpus-per-task=4."),
    ("--gpus-per-node=four", "line 2: #SBATCH --gpus-per-node=four is not a GPU count",
     "--gpus-per-node=4, or with a GPU type: --gpus-per-node=a100:4."),
])
def test_values_sbatch_refuses(directive: str, message: str, hint: str) -> None:
    (f,) = [f for f in lint(f"#!/bin/bash\n#SBATCH {directive}\nsrun -K python t.py\n") if f.code == "invalid-value"]
    assert f.severity == "error" and f.message.startswith(message) and hint in f.hint
    assert f"HINT: {f.hint}" in str(f)


@pytest.mark.parametrize("directive", ["--time=90", "--time=1-00:00:00", "--time=UNLIMITED", "-t 5:00",
                                       "--nodes=2-4", "-N1", "--ntasks=8", "--gpus-per-node=a100:4", "--gpus=0"])
def test_valid_values_pass(directive: str) -> None:
    assert [f for f in lint(f"#!/bin/bash\n#SBATCH {directive}\nsrun -K python t.py\n")
            if f.code == "invalid-value"] == []


def test_nodes_overridden_by_an_invalid_value_is_reported_on_its_line() -> None:
    found = lint("#!/bin/bash\n#SBATCH -N 4\n#SBATCH --nodes=-1\nsrun -K python t.py\n")
    assert [(f.code, f.message[:8]) for f in found] == [("invalid-value", "line 3: ")]


def test_no_directives_and_no_command_is_said() -> None:
    (f,) = lint("#!/bin/bash\necho hello\n")
    assert (f.severity, f.code) == ("warning", "no-directives")
    assert f.message.startswith("no #SBATCH directives and no srun, torchrun or python line found")
    assert "#SBATCH --nodes=2" in f.hint


def test_no_directives_with_a_command_is_a_note() -> None:
    (f,) = lint("#!/bin/bash\nsrun python t.py\n")
    assert (f.severity, f.code) == ("info", "no-directives") and "against Slurm's defaults" in f.message


def test_directive_after_the_first_command_is_ignored_by_sbatch() -> None:
    (f,) = lint("#!/bin/bash\n#SBATCH -N 1\necho hi\n#SBATCH --nodes=2\n")
    assert (f.code, f.message) == ("late-directive", "line 4: #SBATCH after the first command: sbatch ignores it.")


def test_cli_reports_unreadable_scripts_and_lints_the_rest(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin.sbatch").write_bytes(b"\x00\x01\xff\xfe binary")
    (tmp_path / "good.sbatch").write_text("#!/bin/bash\n#SBATCH -N 1\nsrun python t.py\n")
    (tmp_path / "dir").mkdir()
    assert main(["lint", "bin.sbatch", "dir", "good.sbatch", "missing.sbatch"]) == 2
    out, err = capsys.readouterr()
    assert out == "good.sbatch: ok\n"
    assert err.splitlines() == [
        "error: bin.sbatch is not a text file (a NUL byte at offset 0). "
        "HINT: pass the sbatch script itself, e.g. torchslurm lint job.sbatch.",
        "error: cannot read dir: Is a directory. HINT: pass the script files in it, e.g. torchslurm lint dir/*.sbatch.",
        f"error: cannot read missing.sbatch: No such file or directory. HINT: check the path (a relative path starts "
        f"at {tmp_path}).",
    ]


def test_cli_lints_a_script_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "latin1.sbatch"
    script.write_bytes(b"#!/bin/bash\n# caf\xe9\n#SBATCH --ntasks=4\npython t.py\n")  # sbatch accepts it
    assert main(["lint", str(script)]) == 1
    assert "error: [python-without-srun] line 4:" in capsys.readouterr().out


TORCHRUN = FIXTURES / "lint_torchrun"
TORCHRUN_JOB = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=4\n"


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


STATIC = "torchrun --nnodes=2 --nproc-per-node=4 --master-addr=$head --master-port=$port"


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


@pytest.mark.parametrize(("launch", "flagged"), [
    ("srun -K torchrun --standalone --nproc-per-node=4 --master_port=29500 t.py", False),  # ignored: standalone
    ("torchrun --nproc-per-node=4 --master-port 29400 t.py", True),
    ("torchrun --nproc-per-node=4 --master-port=$((10000 + SLURM_JOB_ID % 20000)) t.py", False),
])
def test_fixed_master_port_on_the_launcher(launch: str, flagged: bool) -> None:
    text = "#!/bin/bash\n#SBATCH --ntasks-per-node=1 --gpus-per-node=4\n" + launch + "\n"
    assert bool(_only(text, "fixed-master-port")) is flagged


def test_misspelled_sbatch_option_is_refused_with_a_suggestion() -> None:
    (f,) = lint((TORCHRUN / "misspelled_option.sbatch").read_text())
    assert (f.severity, f.code) == ("error", "unknown-option")
    assert f.message == ("line 3: #SBATCH --nodse=2: sbatch has no option --nodse and refuses the script (`sbatch: "
                         "unrecognized option`; checked against sbatch 22.05's options).")
    assert f.hint == "did you mean --nodes? #SBATCH --nodes=2."


@pytest.mark.parametrize(("directive", "message", "hint"), [
    ("--cpus_per_task=8", "#SBATCH --cpus_per_task=8: sbatch has no option --cpus_per_task",
     "did you mean --cpus-per-task? #SBATCH --cpus-per-task=8."),
    ("--gpus-per-nod 4", "#SBATCH --gpus-per-node=4", None),  # a unique prefix: getopt_long takes it
    ("--requeu", "#SBATCH --requeue", None),
    ("--no=1", "#SBATCH --no=1: --no is ambiguous, the start of --no-kill, --no-requeue, --nodefile, --nodelist, "
     "--nodes; sbatch refuses the script.", "spell the option out, e.g. #SBATCH --no-kill=1."),
    ("--frobnicate", "#SBATCH --frobnicate: sbatch 22.05 has no option --frobnicate; unless this cluster's newer "
     "Slurm or a SPANK plugin", "check the spelling in `sbatch --help` (or `man sbatch`) on the login node."),
    ("--ntask-per-node=4", "#SBATCH --ntask-per-node=4: sbatch has no option", "did you mean --ntasks-per-node?"),
    # options of newer Slurm versions (24.05, 24.11) are no typos: a warning only
    ("--tres-bind=gres/gpu:closest", "#SBATCH --tres-bind=gres/gpu:closest: sbatch 22.05 has no option",
     "check the spelling"),
    ("--oom-kill-step", "#SBATCH --oom-kill-step: sbatch 22.05 has no option", "check the spelling"),
    ("--container-image=nvcr.io/nvidia/pytorch:24.01-py3", None, None),  # pyxis, a SPANK plugin
    ("-X 1", "#SBATCH -X 1: sbatch has no option -X", "check the letter in `sbatch --help`"),
    ("-N 2 -W", None, None), ("--open-mode=append --kill-on-invalid-dep=yes --hint=nomultithread", None, None),
])
def test_sbatch_options_checked_against_sbatchs_own_list(directive: str, message: str | None,
                                                         hint: str | None) -> None:
    found = [f for f in lint(f"#!/bin/bash\n#SBATCH {directive}\nsrun -K python t.py\n") if f.code == "unknown-option"]
    if hint is None:
        assert found == []
        if message:  # the abbreviation is read as the option it names
            key, _, value = message.removeprefix("#SBATCH --").partition("=")
            assert parse(f"#!/bin/bash\n#SBATCH {directive}\n").directives == {key: value}
    else:
        (f,) = found
        assert f.message.startswith(f"line 2: {message}") and f.hint.startswith(hint)
        assert f.severity == ("warning" if "SPANK" in f.message else "error")


@pytest.mark.parametrize(("a", "b", "edits"), [("nodse", "nodes", 1), ("ntask-per-node", "ntasks-per-node", 1),
                                               ("", "abc", 3), ("kitten", "sitting", 3), ("same", "same", 0)])
def test_edit_distance_counts_a_swap_as_one_edit(a: str, b: str, edits: int) -> None:
    assert edit_distance(a, b) == edits


def test_script_without_shebang_is_refused_by_sbatch() -> None:
    (f,) = lint((TORCHRUN / "no_shebang.sbatch").read_text())
    assert (f.severity, f.code) == ("error", "no-shebang")
    assert f.message == ("line 1 is `#SBATCH --nodes=2 --ntasks-per-node=1 --...`, not `#!` and an "
                         "interpreter: sbatch refuses the script (\"This does not look like a batch script\").")
    assert f.hint == "#!/bin/bash as the very first line."


@pytest.mark.parametrize(("text", "flagged"), [
    ("\n#!/bin/bash\nsrun python t.py\n", "line 1 is empty"), (" #!/bin/bash\nsrun python t.py\n", "line 1 is ` #!"),
    ("", "line 1 is empty"), ("#!/usr/bin/env python3\nprint(1)\n", None), ("#!/bin/sh\nsrun python t.py\n", None),
])
def test_shebang_must_be_the_first_two_bytes(text: str, flagged: str | None) -> None:
    found = [f.message for f in lint(text) if f.code == "no-shebang"]
    assert [m.startswith(flagged) for m in found] == ([True] if flagged else [])


def test_srun_fewer_tasks_per_node_than_gpus_leaves_gpus_idle() -> None:
    (f,) = lint((TORCHRUN / "srun_fewer_tasks.sbatch").read_text())
    assert (f.severity, f.code) == ("warning", "srun-tasks-vs-gpus")
    assert f.message == ("line 4: srun --ntasks-per-node=1 starts 1 rank(s) per node, overriding #SBATCH's 4, and 3 "
                         "of the 4 GPU(s) per node stay idle.")
    assert f.hint == "srun --ntasks-per-node=4 (one rank per GPU), or drop --ntasks-per-node=1 to use the job's layout."


@pytest.mark.parametrize(("job", "srun", "found"), [
    ("--ntasks-per-node=4", "srun -K -n 2", [("warning", "srun-tasks-vs-gpus")]),
    ("--ntasks-per-node=4", "srun -K --ntasks-per-node=8", [("error", "srun-tasks-vs-gpus")]),
    ("--ntasks-per-node=1", "srun -K --ntasks-per-node=4", []),  # srun fixes the job's layout
    ("--ntasks-per-node=1", "srun -K", [("error", "tasks-vs-gpus")]),
    ("--ntasks-per-node=4", "srun -K --ntasks-per-node=$N", []),  # not literal: lint cannot count
    ("--ntasks-per-node=4", "srun -K -n 8", []),
])
def test_srun_layout_against_the_gpus(job: str, srun: str, found: list[tuple[str, str]]) -> None:
    text = f"#!/bin/bash\n#SBATCH --nodes=2 {job} --gpus-per-node=4\n{srun} python train.py\n"
    assert [(f.severity, f.code) for f in lint(text)] == found


def test_cli_reads_the_script_from_stdin_for_a_dash(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-").write_text("#!/bin/bash\n#SBATCH -N 1\nsrun python t.py\n")  # ./- is the file named -
    stdin = io.TextIOWrapper(io.BytesIO((TORCHRUN / "no_rendezvous.sbatch").read_bytes()))
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["lint", "-", "./-"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("<stdin>: error: [torchrun-no-rendezvous] line 4: torchrun --nnodes=2 without")
    assert out[-1] == "-: ok"


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
