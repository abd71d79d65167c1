"""What a command runs (lint/programs.py): wrappers, launchers and python training, a launcher's options."""

from __future__ import annotations

import pytest

from torchslurm.lint.programs import launcher_args, procs_per_node, started, unwrap


@pytest.mark.parametrize(("command", "launcher"), [
    ("torchrun --nproc-per-node=4 t.py", "torchrun"),
    ("python -m torch.distributed.run t.py", "torchrun"),
    ("python3 -u -m accelerate.commands.launch t.py", "accelerate"),
    ("accelerate launch t.py", "accelerate"),
    ("deepspeed t.py", "deepspeed"),
    ("colossalai run --nproc_per_node 4 t.py", "colossalai"),
    ("python ./deepy.py train.py c.yml", "deepy"),
    ("python /opt/multiproc.py t.py", "multiproc"),
    ("python -m multiproc t.py", "multiproc"),
    ("python train.py", None),
    ("python -m torchtitan.train", None),
    ("python3.11 -B -W ignore -m pkg.train --lr 1", None),
])
def test_what_starts_training(command: str, launcher: str | None) -> None:
    program = started(command.split())
    assert program is not None and program[0] == launcher


@pytest.mark.parametrize("command", ["python -m pip install x", "python -c pass", "python", "python --version",
                                     "colossalai check -i", "accelerate config", "echo python t.py"])
def test_what_does_not_train(command: str) -> None:
    assert started(command.split()) is None


def test_the_module_is_not_an_argument_of_the_program() -> None:
    assert started(["python", "-u", "-m", "pkg.train", "--lr", "1"]) == (None, ["--lr", "1"])


def test_a_launchers_options_end_at_the_training_script() -> None:
    opts = launcher_args("torchrun", ["--nproc_per_node", "4", "--standalone", "t.py", "--nnodes", "9"])
    assert opts == {"nproc-per-node": "4", "standalone": ""} and procs_per_node("torchrun", opts) == 4
    assert launcher_args(None, ["--lr", "1"]) == {}


def test_wrappers_are_seen_through() -> None:
    assert unwrap(["env", "A=1", "python", "t.py"]) == ["python", "t.py"]
    assert unwrap(["apptainer", "exec", "--nv", "img.sif", "python", "t.py"]) == ["python", "t.py"]
    # apptainer's global options come before its subcommand: --quiet, -s, ...
    assert unwrap(["/usr/bin/singularity", "--quiet", "-s", "exec", "-B", "/d", "img.sif", "python", "t.py"]) == [
        "python", "t.py"]
    assert unwrap(["apptainer", "--quiet", "shell", "img.sif"]) is None
    # a short option's value or other short flags attached to it are one word (OLMo's -B"$DIR:$DIR")
    for options in (["-B/data:/data"], ["-ce"], ["--bind=/d"], ["--bind", "/d"], ["-B", "/d", "--nv"]):
        assert unwrap(["singularity", "exec", *options, "img.sif", "python", "t.py"]) == ["python", "t.py"]
    assert unwrap(["enroot", "start", "-rw", "img", "python", "t.py"]) == ["python", "t.py"]
    assert unwrap(["apptainer", "build", "img.sif", "def"]) is None
    assert unwrap(["python", "t.py"]) is None
