"""What each command line runs, and under which srun: `bash -c` and `eval` read as code, wrappers seen through,
redirections dropped, Slurm's counts in `$(( ))`, and the depth to which code inside code is read."""

from __future__ import annotations

import pytest

from torchslurm.lint.lines import Unclosed
from torchslurm.lint.parse import MAX_WRAPPERS, Launch, parse
from torchslurm.lint.shell import MAX_NESTING


def _launch(text: str) -> Launch:
    (launch,) = parse(f"#!/bin/bash\n#SBATCH -N 2 --ntasks=8 --ntasks-per-node=4\n{text}\n").launches
    return launch


def _seen(launch: Launch) -> tuple[int, bool, dict[str, str], bool, list[str]]:
    return launch.line, launch.under_srun, launch.srun_opts, launch.per_task, launch.words


@pytest.mark.parametrize(("line", "seen"), [
    ("srun -K python t.py > train.log 2>&1", (3, True, {"kill-on-bad-exit": ""}, False, ["srun", "-K", "python",
                                                                                           "t.py"])),
    ("srun -K python t.py 2>err.log --epochs 3 >out.log", (3, True, {"kill-on-bad-exit": ""}, False,
                                                            ["srun", "-K", "python", "t.py", "--epochs", "3"])),
    ("srun -K python t.py > out.log --epochs 3", (3, True, {"kill-on-bad-exit": ""}, False,
                                                   ["srun", "-K", "python", "t.py", "--epochs", "3"])),
    ("srun -N1 sh -c 'python t.py'", (3, True, {"nodes": "1"}, True, ["srun", "-N1", "python", "t.py"])),
    ("srun -N1 zsh -c 'python t.py'", (3, True, {"nodes": "1"}, True, ["srun", "-N1", "python", "t.py"])),
    ("srun -N1 dash -c 'python t.py'", (3, True, {"nodes": "1"}, True, ["srun", "-N1", "python", "t.py"])),
    ("srun -N1 bash -l -c 'python t.py'", (3, True, {"nodes": "1"}, True, ["srun", "-N1", "python", "t.py"])),
    ("srun -N1 bash --norc -c 'python t.py'", (3, True, {"nodes": "1"}, True, ["srun", "-N1", "python", "t.py"])),
    ("srun -N1 bash -lc 'python t.py'", (3, True, {"nodes": "1"}, True, ["srun", "-N1", "python", "t.py"])),
    ("srun -N1 bash -c 'bash -c \"python t.py\"'", (3, True, {"nodes": "1"}, True, ["srun", "-N1", "python",
                                                                                      "t.py"])),
    ("srun -N2 bash -c 'srun -N1 bash -c \"python t.py\"'", (3, True, {"nodes": "1"}, True,
                                                             ["srun", "-N1", "python", "t.py"])),
    ("bash -c 'python t.py'", (3, False, {}, False, ["python", "t.py"])),
    ("srun -K bash -c 'exec \"$@\"' wrapper python t.py", (3, True, {"kill-on-bad-exit": ""}, False,
                                                            ["srun", "-K", "python", "t.py"])),
    ("srun -K bash -c 'exec $@' wrapper python t.py", (3, True, {"kill-on-bad-exit": ""}, False,
                                                        ["srun", "-K", "python", "t.py"])),
    ("srun -K env A=1 nice -n 5 python t.py", (3, True, {"kill-on-bad-exit": ""}, False,  # wrappers kept
                                               ["srun", "-K", "env", "A=1", "nice", "-n", "5", "python", "t.py"])),
    ("srun -K apptainer exec --nv i.sif bash -c 'python t.py'", (3, True, {"kill-on-bad-exit": ""}, True,
                                                                  ["srun", "-K", "apptainer", "exec", "--nv", "i.sif",
                                                                   "python", "t.py"])),
    ("CMD='srun -K python t.py'\neval $CMD", (4, True, {"kill-on-bad-exit": ""}, False,
                                             ["srun", "-K", "python", "t.py"])),
    ("srun -K bash -c 'eval python t.py'", (3, True, {"kill-on-bad-exit": ""}, True, ["srun", "-K", "python", "t.py"])),
])
def test_each_line_runs_what_bash_runs_under_the_srun_that_starts_it(line: str, seen: tuple[object, ...]) -> None:
    assert _seen(_launch(line)) == seen


@pytest.mark.parametrize("line", ["srun --pty bash -l", "srun --pty bash -i", "srun bash -c", "srun bash -x ./train.sh",
                                  "srun bash -c 'exec \"$@\"'", "srun env", "srun -K"])
def test_a_shell_or_wrapper_that_runs_no_code_starts_no_launch(line: str) -> None:
    script = parse(f"#!/bin/bash\n{line}\n")
    assert script.launches == [] and [c.text for c in script.commands] == [line]


def test_wrappers_are_seen_through_to_the_limit() -> None:
    wrappers = ["env A=1", "nice -n 5", "numactl --interleave=all", "stdbuf -oL", "ionice -c 2", "nohup", "setsid",
                "timeout 1h", "command"]
    assert len(wrappers) == MAX_WRAPPERS + 1
    words = _launch("srun -K " + " ".join(wrappers[:MAX_WRAPPERS]) + " python t.py").words
    assert words == ["srun", "-K", *" ".join(wrappers[:MAX_WRAPPERS]).split(), "python", "t.py"]
    assert parse("srun -K " + " ".join(wrappers) + " python t.py\n").launches == []


def test_signals_a_wrapper_shell_ignores_and_the_launchers_own_are_kept() -> None:
    launch = _launch("srun -K bash -c 'trap \"\" TERM; trap \"\" USR1; exec \"$@\"' wrapper torchrun "
                     "--signals-to-handle=SIGUSR1,SIGTERM --nproc-per-node 4 t.py")
    assert (launch.ignored, launch.signals_to_handle, launch.nproc_per_node) == (["TERM", "USR1"], "SIGUSR1,SIGTERM",
                                                                                 4)
    assert (_launch("srun -K deepspeed --num_gpus 4 t.py").nproc_per_node,
            _launch("srun -K accelerate launch --num_processes 8 --num_machines 2 t.py").nproc_per_node) == (4, 4)


def test_variables_and_arrays_reach_the_code_of_each_task() -> None:
    launch = _launch("X=1\nA=(--lr 2)\nsrun -K bash -c 'python t.py $X \"${A[@]}\" $((SLURM_NNODES * 4))'")
    assert launch.words == ["srun", "-K", "python", "t.py", "1", "--lr", "2", "8"]
    launch = _launch("bash -c 'python t.py $((SLURM_JOB_NUM_NODES + UNSET)) \"${A[@]}\"'")
    assert launch.words == ["python", "t.py", "$((SLURM_JOB_NUM_NODES + UNSET))", "${A[@]}"]


def test_slurm_counts_fixed_by_the_directives_are_known_in_arithmetic_only() -> None:
    launch = _launch("srun -K python t.py $((SLURM_NNODES)) $((SLURM_JOB_NUM_NODES)) $((SLURM_NTASKS)) "
                     "$((SLURM_NTASKS_PER_NODE)) $SLURM_NNODES ${SLURM_NTASKS}")
    assert launch.words[4:] == ["2", "2", "8", "4", "$SLURM_NNODES", "${SLURM_NTASKS}"]
    (launch,) = parse("#!/bin/bash\n#SBATCH -N 2x\npython t.py $((SLURM_NNODES))\n").launches
    assert launch.words == ["python", "t.py", "$((SLURM_NNODES))"]


def _nested(evals: int, inner: str = "python t.py") -> str:
    return "eval " * evals + inner


@pytest.mark.parametrize("wrap", [lambda code: code, lambda code: f"bash -c '{code}'"])
def test_code_inside_code_is_read_down_to_the_nesting_limit(wrap) -> None:  # type: ignore[no-untyped-def]
    evals = MAX_NESTING - (wrap("") != "")  # `bash -c` is one level
    script = parse(f"#!/bin/bash\necho start\n{wrap(_nested(evals))}\n")
    assert [ln.line for ln in script.launches] == [3] and script.unclosed == []
    script = parse(f"#!/bin/bash\necho start\n{wrap(_nested(evals + 1))}\n")
    assert script.launches == []
    assert script.unclosed == [Unclosed(3, "bash -c", heredoc=False, nested=True)]


def test_a_quote_left_open_in_code_inside_code_is_recorded_at_its_line() -> None:
    script = parse("#!/bin/bash\necho start\nsrun -K bash -c 'x=$(hostname'\n")
    assert script.unclosed == [Unclosed(3, "$(", heredoc=False)]


def test_a_directive_line_is_read_whole_as_getopt_permutes_it() -> None:
    script = parse("#!/bin/bash\n#SBATCH --nodes 2 extra --time=10\nsrun -K python t.py\n")
    assert script.directive_list == [(2, "nodes", "2"), (2, "time", "10")]
