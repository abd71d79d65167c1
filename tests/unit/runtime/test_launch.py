"""launch.plan: which way `torchslurm run` starts ranks, decided from the environment alone."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from torchslurm.errors import ConfigError
from torchslurm.runtime.launch import (
    LaunchPlan,
    cannot_start,
    cpu_oversubscription,
    gpus_on_node,
    mark_finished,
    plan,
    root_cause,
    signal_error,
    signal_exit_code,
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


TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "r1"}
MPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
       "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(("environ", "launcher"), [(SRUN, "srun"), (TORCHRUN, "torchrun"), (MPI, "mpi")])
def test_a_rank_of_any_launcher_execs_its_script_as_itself(environ: dict[str, str], launcher: str) -> None:
    from torchslurm.runtime.distenv import detect

    env = detect(environ, free_port=lambda: 0)
    assert env.launcher == launcher
    assert plan(environ, "t.py", ["x"], None, PY, 0) == LaunchPlan(
        mode="exec", argv=(PY, "t.py", "x"), env={**env.torchrun_environ(), "TORCHSLURM_LAUNCHER": launcher},
        reason=f"already a rank: {env.reason}", script="t.py", module=False)
    assert plan(environ, "pkg.m", [], None, PY, 0, module=True).module


@pytest.mark.parametrize(("nproc", "gpus", "count", "why"), [
    (3, 8, 3, "--nproc"), (None, 4, 4, "one per visible GPU"), (None, 0, 2, "default on CPU")])
def test_local_ranks_say_where_their_count_came_from(nproc: int | None, gpus: int, count: int, why: str) -> None:
    assert plan({}, "t.py", [], nproc, PY, gpus) == LaunchPlan(
        mode="local", argv=(PY, "t.py"), nproc=count, reason=f"no launcher found: {count} local rank(s) ({why}).",
        script="t.py")


def test_the_batch_shell_s_srun_step_whole() -> None:
    gpus = {**BATCH, "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_GPUS": "0,1,2,3", "SLURM_CPUS_ON_NODE": "6"}
    assert plan(gpus, "t.py", ["a"], None, PY, 0, module=False) == LaunchPlan(
        mode="srun", argv=("srun", "--export=ALL", "--kill-on-bad-exit=1", "--nodes=2", "--ntasks=8",
                           "--ntasks-per-node=4", "--cpus-per-task=1", PY, "-m", "torchslurm", "run", "t.py", "a"),
        reason="inside a Slurm allocation without srun: 4 rank(s) per node on 2 node(s).", script="t.py")
    # salloc's shell says SLURM_JOB_NUM_NODES only; without SLURM_CPUS_ON_NODE each rank gets one CPU
    salloc = {"SLURM_JOB_ID": "78", "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_NODELIST": "node[1-3]"}
    step = plan(salloc, "pkg.m", [], 2, PY, 0, module=True)
    assert step.argv[3:7] == ("--nodes=3", "--ntasks=6", "--ntasks-per-node=2", "--cpus-per-task=1")
    assert (step.script, step.module) == ("pkg.m", True)
    tasks = plan({k: v for k, v in BATCH.items() if k != "SLURM_NNODES"}, "t.py", [], None, PY, 0)
    assert tasks.reason == "inside a Slurm allocation without srun: one rank per allocated task (SLURM_NTASKS=4)."
    one = {k: v for k, v in BATCH.items() if k not in ("SLURM_NNODES", "SLURM_NTASKS")}
    assert plan(one, "t.py", [], 1, PY, 0).argv[3:5] == ("--nodes=1", "--ntasks=1")
    assert plan(one, "t.py", [], None, PY, 0).reason.endswith("one rank per allocated task (SLURM_NTASKS=1).")


def test_gpus_on_node_without_a_count_from_slurm() -> None:
    assert gpus_on_node({"SLURM_GPUS_ON_NODE": "x", "SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0, ,1"}) == 2
    assert gpus_on_node({"SLURM_JOB_GPUS": "0"}) == 0  # no CUDA_VISIBLE_DEVICES: none visible
    assert gpus_on_node({}) == 0


def test_the_launcher_s_signal_messages_and_codes_whole() -> None:
    import signal

    hint = "run the same command again to continue from the newest checkpoint (resume=auto)."
    ctrl_c = signal_error(signal.SIGINT)
    assert (ctrl_c.message, ctrl_c.hint, ctrl_c.exit_code) == (
        "torchslurm run got Ctrl-C (SIGINT) and passed it on to the ranks; ranks using torchslurm's Trainer stop at "
        "the next step boundary, save a checkpoint and exit with code 130 (a second Ctrl-C stops them at once).",
        hint, 130)
    hup = signal_error(signal.SIGHUP)
    assert (hup.message, hup.hint, hup.exit_code) == (
        "torchslurm run received SIGHUP and passed it on to the ranks; ranks using torchslurm's preemption save a "
        "checkpoint and exit with code 75.", hint, 129)
    assert [signal_exit_code(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)] == [
        75, 75, 75, 131]


def test_a_failure_report_without_ranks_and_every_stop_whole() -> None:
    import os

    host = os.uname().nodename
    plain = root_cause(RuntimeError("agent died"))
    assert (plain.message, plain.hint, plain.exit_code) == ("a rank failed: agent died", None, 1)
    stopped = root_cause(_ChildFailed({3: _Failure(75, timestamp=1)}))
    assert (stopped.message, stopped.hint, stopped.exit_code) == (
        f"rank 3 (host {host}) stopped on request with exit code 75 (preempted or near the time limit) after saving "
        "a checkpoint.", "run the same command again to continue from it (resume=auto).", 75)
    ctrl_c = root_cause(_ChildFailed({0: _Failure(130, timestamp=1)}))
    assert (ctrl_c.message, ctrl_c.hint, ctrl_c.exit_code) == (
        f"rank 0 (host {host}) stopped on Ctrl-C with exit code 130.",
        "ranks using torchslurm's Trainer saved a checkpoint first: run the same command again to continue from it "
        "(resume=auto).", 130)


def test_a_failure_report_whole_with_the_rank_s_message() -> None:
    import os

    host = os.uname().nodename
    error = root_cause(_ChildFailed({
        0: _Failure(-15, timestamp=3), 1: _Failure(1, timestamp=1, pid=7, message="  ValueError: bad batch\n"),
        2: _Failure(0, timestamp=2)}))
    assert (error.message, error.hint, error.exit_code) == (
        f"rank 1 failed first (host {host}, pid 7, exit code 1); its error is above in its output. ValueError: bad "
        "batch then: rank 2 (exit code 0), rank 0 (killed by SIGTERM).",
        "fix rank 1's error first; the other ranks usually fail because it died.", 1)
    killed = root_cause(_ChildFailed({4: _Failure(-9, timestamp=1, message=(
        "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"))}))
    assert killed.message == (
        f"rank 4 failed first (host {host}, pid 4242, killed by SIGKILL); a killed process leaves no traceback: look "
        "for the out-of-memory killer (`dmesg`, the job's memory limit) or who sent the signal.")
    assert killed.exit_code == 137
    zero = root_cause(_ChildFailed({5: _Failure(0, timestamp=1)}))
    assert zero.exit_code == 1  # failed, yet said 0
    assert zero.message == (f"rank 5 failed first (host {host}, pid 4242, exit code 0); its error is above in its "
                            "output.")


def test_a_finished_rank_tells_its_launcher_and_only_it(tmp_path: Path) -> None:
    mark_finished({"TORCHSLURM_FINISHED_DIR": str(tmp_path)}, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["rank-3"]
    mark_finished({"TORCHSLURM_FINISHED_DIR": str(tmp_path / "gone")}, 4)  # the launcher gone: nothing to do
    mark_finished({}, 5)
    assert [p.name for p in tmp_path.iterdir()] == ["rank-3"]


def test_the_signals_passed_on_to_the_ranks() -> None:
    import signal

    from torchslurm.runtime.launch import _forwarded

    assert _forwarded() == [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                            signal.SIGUSR2]


def test_no_gpu_is_counted_where_none_can_be(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's count (4 here, as on a GPU node) is asked only where the driver's device node exists and
    CUDA_VISIBLE_DEVICES does not hide every GPU."""
    import torch

    from torchslurm.runtime.launch import cuda_device_count

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    node = tmp_path / "nvidiactl"
    node.touch()
    assert cuda_device_count({}, str(node)) == 4
    assert cuda_device_count({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, str(node)) == 4
    assert cuda_device_count({"CUDA_VISIBLE_DEVICES": "-1"}, str(node)) == 0
    assert cuda_device_count({"CUDA_VISIBLE_DEVICES": ""}, str(node)) == 0
    assert cuda_device_count({}, str(tmp_path / "absent")) == 0
    monkeypatch.setitem(sys.modules, "torch", None)  # a GPU login node without torch: `import torch` fails
    assert cuda_device_count({}, str(node)) == 0


def test_srun_missing_inside_a_container_says_to_start_the_ranks_outside_it() -> None:
    missing = FileNotFoundError(2, "No such file or directory")
    inside = cannot_start("srun", missing, {"APPTAINER_CONTAINER": "/images/pt.sif"})
    assert (inside.message, inside.hint) == (
        "cannot start 'srun' inside the container /images/pt.sif: No such file or directory.",
        "start the ranks from outside it, one container per task: `srun apptainer exec --nv IMAGE torchslurm run "
        "train.py` in the batch script (each task then runs as one rank).")
    assert cannot_start("srun", missing, {"SINGULARITY_CONTAINER": "x.sif"}).message.startswith(
        "cannot start 'srun' inside the container x.sif:")
    assert cannot_start("srun", OSError("odd"), {}).message == "cannot start 'srun': odd."
    for program, environ in (("srun", {}), ("srun", {"APPTAINER_CONTAINER": ""}),
                             ("python3", {"APPTAINER_CONTAINER": "/images/pt.sif"})):
        plain = cannot_start(program, missing, environ)
        assert (plain.message, plain.hint) == (f"cannot start {program!r}: No such file or directory.",
                                               "check that it is installed and on PATH on every node.")

