"""launch.plan: which way `torchslurm run` starts ranks, decided from the environment alone."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from torchslurm.errors import ConfigError
from torchslurm.runtime.launch import (
    check_run_options,
    cpu_oversubscription,
    gpus_on_node,
    module_problem,
    nproc_problem,
    plan,
    root_cause,
    script_problem,
    signal_error,
)

PY = "/venv/bin/python"
BATCH = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_NTASKS": "4", "SLURM_CPUS_ON_NODE": "8",
         "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
SRUN = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
        "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_STEP_NODELIST": "node1"}


def test_local_defaults_to_two_ranks_on_cpu() -> None:
    p = plan({}, "train.py", ["--lr", "0.1"], None, PY, cuda_device_count=0)
    assert (p.mode, p.nproc, p.argv) == ("local", 2, (PY, "train.py", "--lr", "0.1"))


def test_local_uses_one_rank_per_gpu() -> None:
    assert plan({}, "t.py", [], None, PY, cuda_device_count=8).nproc == 8
    assert plan({}, "t.py", [], 3, PY, cuda_device_count=8).nproc == 3


def test_batch_shell_on_cpu_uses_the_allocated_tasks() -> None:
    p = plan(BATCH, "t.py", ["a b"], None, PY, cuda_device_count=0)
    assert p.mode == "srun"
    assert p.argv == ("srun", "--export=ALL", "--kill-on-bad-exit=1", PY, "-m", "torchslurm", "run", "t.py", "a b")


def test_batch_shell_with_gpus_starts_one_rank_per_gpu_on_every_node() -> None:
    p = plan({**BATCH, "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_GPUS": "0,1,2,3"}, "t.py", [], None, PY, 0)
    assert p.argv[3:7] == ("--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--cpus-per-task=2")
    assert "4 rank(s) per node on 2 node(s)" in p.reason


def test_nproc_in_batch_shell_means_per_node() -> None:
    p = plan(BATCH, "t.py", [], 1, PY, 0)
    assert "--ntasks=2" in p.argv and "--ntasks-per-node=1" in p.argv and "--cpus-per-task=8" in p.argv


def test_srun_task_execs_the_script_with_a_torchrun_environment() -> None:
    p = plan(SRUN, "t.py", ["x"], None, PY, 0)
    assert (p.mode, p.argv) == ("exec", (PY, "t.py", "x"))
    assert (p.env["RANK"], p.env["WORLD_SIZE"], p.env["LOCAL_RANK"], p.env["MASTER_ADDR"]) == ("1", "2", "1", "node1")
    assert p.env["TORCHSLURM_LAUNCHER"] == "srun"  # the rank (and its doctor) says srun, not torchrun


def test_the_launchers_own_variables_make_an_exec_rank_say_srun() -> None:
    from torchslurm.runtime.distenv import detect

    p = plan(SRUN, "t.py", [], None, PY, 0)
    rank = detect({**SRUN, **p.env})
    assert (rank.launcher, rank.rank, rank.world_size) == ("srun", 1, 2)


def test_more_ranks_than_cpus_or_than_slurm_gave_is_a_warning_with_the_fix() -> None:
    assert cpu_oversubscription({}, 2, 2) is None
    many = cpu_oversubscription({}, 32, 2)
    assert many is not None and "32 ranks on this node but 2 CPU(s) usable here" in many.message
    assert many.hint is not None and "--nproc 2" in many.hint
    slurm = cpu_oversubscription({"SLURM_CPUS_ON_NODE": "4"}, 8, 64)
    assert slurm is not None and "8 ranks on this node but SLURM_CPUS_ON_NODE=4" in slurm.message
    assert cpu_oversubscription({"SLURM_CPUS_ON_NODE": "4"}, 4, 64) is None
    assert cpu_oversubscription({"SLURM_CPUS_ON_NODE": "4"}, 4, 1) is None  # an srun task bound to its own CPU


def test_ctrl_c_to_the_launcher_says_what_the_ranks_do_and_exits_130() -> None:
    import signal

    error = signal_error(signal.SIGINT)
    assert error.exit_code == 130 and "got Ctrl-C (SIGINT)" in error.message
    assert "save a checkpoint and exit with code 130" in error.message and "75" not in error.message
    assert signal_error(signal.SIGTERM).exit_code == 75


def test_gpus_on_node_from_slurm_variables() -> None:
    assert gpus_on_node({"SLURM_GPUS_ON_NODE": "2"}) == 2
    assert gpus_on_node({"SLURM_JOB_GPUS": "0,1,2", "CUDA_VISIBLE_DEVICES": "0,1,2"}) == 3
    assert gpus_on_node({"CUDA_VISIBLE_DEVICES": "0,1"}) == 0  # not Slurm's doing: no GPU request


def test_nproc_must_be_positive() -> None:
    with pytest.raises(ConfigError, match=r"--nproc=0 must be at least 1\. HINT"):
        plan({}, "t.py", [], 0, PY, 0)


def test_module_runs_as_python_dash_m_in_every_mode() -> None:
    local = plan({}, "pkg.rank", ["--x"], 1, PY, 0, module=True)
    assert (local.argv, local.script, local.module) == ((PY, "-m", "pkg.rank", "--x"), "pkg.rank", True)
    assert plan(SRUN, "pkg.rank", [], None, PY, 0, module=True).argv == (PY, "-m", "pkg.rank")
    assert plan(BATCH, "pkg.rank", ["a"], None, PY, 0, module=True).argv[-6:] == (
        "-m", "torchslurm", "run", "-m", "pkg.rank", "a")


def test_nproc_problem_is_the_one_rule() -> None:
    assert nproc_problem(None) is None and nproc_problem(1) is None
    problem = nproc_problem(-1)
    assert problem is not None
    assert (problem.message, problem.hint) == ("--nproc=-1 must be at least 1.", "--nproc 2 starts two ranks.")


def test_a_module_that_python_cannot_find_is_refused() -> None:
    assert module_problem("torchslurm.cli.doctor") is None
    problem = module_problem("torchslurm.no_such_module")
    assert problem is not None and problem.message == (
        "module 'torchslurm.no_such_module' cannot be imported here; expected a module that `python -m` can run.")
    with pytest.raises(ConfigError, match=r"module 'nope_pkg\.x' cannot be imported here"):
        check_run_options("nope_pkg.x", None, 0, module=True)


def test_script_problem_is_an_error_with_a_hint(tmp_path: Path) -> None:
    problem = script_problem(str(tmp_path / "none.py"))
    assert problem is not None and problem.hint == (
        "give the path of the training script, e.g. `torchslurm run --nproc 2 train.py`.")
    assert script_problem(__file__) is None


def test_counting_gpus_on_a_gpu_node_without_torch_is_zero_not_a_crash(
        without_torch: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    """A GPU login node (the driver's device node exists) where torch is not installed: planning a
    job (`torchslurm run --dry-run`, the batch shell's srun) must not need torch."""
    node = tmp_path / "nvidiactl"
    node.touch()
    code = ("from torchslurm.runtime.launch import cuda_device_count; "
            f"print(cuda_device_count({{}}, {str(node)!r}), cuda_device_count({{'CUDA_VISIBLE_DEVICES': ''}}, '/'))")
    result = without_torch("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "0"]


class _Failure:
    """What torch's elastic agent reports per failed rank (ProcessFailure's fields that root_cause reads)."""

    def __init__(self, exitcode: int, timestamp: int, pid: int = 4242, message: str = "") -> None:
        self.exitcode, self.timestamp, self.pid, self.message = exitcode, timestamp, pid, message


class _ChildFailed(Exception):
    def __init__(self, failures: dict[int, _Failure]) -> None:
        self.failures = failures


def test_the_first_failing_rank_is_named_first_with_its_exit_code() -> None:
    error = root_cause(_ChildFailed({0: _Failure(-15, timestamp=2), 1: _Failure(3, timestamp=1)}))
    assert error.message.startswith("rank 1 failed first (")
    assert "exit code 3); its error is above in its output. then: rank 0 (killed by SIGTERM)." in error.message
    assert error.exit_code == 3 and error.hint is not None and "fix rank 1's error first" in error.hint


def test_a_rank_stopped_by_ctrl_c_is_a_stop_not_a_failure() -> None:
    error = root_cause(_ChildFailed({1: _Failure(130, timestamp=1), 0: _Failure(130, timestamp=2)}))
    assert error.message.startswith("rank 1 (host ") and "stopped on Ctrl-C with exit code 130" in error.message
    assert error.exit_code == 130 and error.hint is not None and "resume=auto" in error.hint


def test_a_rank_killed_by_a_signal_is_not_said_to_have_a_traceback() -> None:
    error = root_cause(_ChildFailed({2: _Failure(-9, timestamp=1)}))
    assert "killed by SIGKILL); a killed process leaves no traceback" in error.message
    assert "traceback is above" not in str(error)
