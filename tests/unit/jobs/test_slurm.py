"""SlurmClient, the seam that runs Slurm commands, on outputs recorded from the sandbox's Slurm 22.05.8
(tests/fixtures/slurm_output/, rewritten by TORCHSLURM_RECORD_FIXTURES=1 on the cluster tests),
plus the job CLI commands with torch blocked."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from tests.unit.jobs.conftest import FakeRun, fixture

from torchslurm.errors import SlurmError
from torchslurm.jobs.slurm import NOT_FOUND, TIMED_OUT, SlurmClient, run_command, run_command_status
from torchslurm.jobs.slurmoutput import (
    SINFO_FORMAT,
    end_time_from_scontrol,
    parse_scontrol,
    status_from_scontrol,
)
from torchslurm.jobs.slurmvalues import parse_slurm_version

WithoutTorch = Callable[..., subprocess.CompletedProcess[str]]


def test_version() -> None:
    assert parse_slurm_version(fixture("sbatch_version.txt")) == (22, 5)


def test_client_submit_and_errors() -> None:
    run = FakeRun({"sbatch": (0, fixture("sbatch_parsable.txt"), "")})
    assert SlurmClient(run=run).submit(Path("/r/job.sbatch")) == "3"
    assert run.calls == [["sbatch", "--parsable", "/r/job.sbatch"]]
    bad = FakeRun({"sbatch": (1, "", "sbatch: error: Batch job submission failed: Invalid partition name")})
    with pytest.raises(SlurmError, match=r"sbatch --parsable /r/job.sbatch failed \(1\): sbatch: error: Batch "
                                         r"job submission failed: Invalid partition name\. HINT"):
        SlurmClient(run=bad).submit(Path("/r/job.sbatch"))


def test_client_queue_of_a_job_that_left() -> None:
    run = FakeRun({"squeue": (1, "", fixture("squeue_invalid_job.stderr"))})
    assert SlurmClient(run=run).queue("999999") == []
    with pytest.raises(SlurmError, match=r"squeue failed \(1\): slurm_load_jobs error: Invalid job id.*HINT: the "
                                         "message above is Slurm's"):
        SlurmClient(run=run).queue()


@pytest.mark.parametrize("command, recorded", [("squeue", "squeue_no_controller.stderr"),
                                               ("scontrol", "scontrol_no_config.stderr")])
def test_no_controller_or_no_config_is_said_so_not_blamed_on_the_job(command: str, recorded: str) -> None:
    client = SlurmClient(run=FakeRun({command: (1, "", fixture(recorded))}))
    with pytest.raises(SlurmError, match=r"HINT: Slurm's controller cannot be reached from here: check that "
                                         r"SLURM_CONF .* `torchslurm sandbox up`") as raised:
        client.queue() if command == "squeue" else client.status("12345")
    assert "unknown to Slurm" not in str(raised.value)


@pytest.mark.parametrize("job_id", ["notajob", "12 34", "-1", "12345;rm", "", "١٢٣", "12345_[1-3"])
def test_a_malformed_job_id_is_refused_before_slurm_runs(job_id: str) -> None:
    run = FakeRun({})
    for call in (lambda c: c.status(job_id), lambda c: c.cancel(job_id), lambda c: c.queue(job_id)):
        with pytest.raises(SlurmError, match=rf"job id {re.escape(repr(job_id))} is not a Slurm job id: expected "
                                             r"digits.*HINT: `torchslurm status` lists"):
            call(SlurmClient(run=run))
    assert run.calls == []
    for good in ("12345", "12345_7", "12345_[1-3,5]", "12345+1"):
        SlurmClient(run=FakeRun({"scancel": (0, "", ""), "scontrol": (0, fixture("scontrol_running.txt"), "")})
                    ).cancel(good)


def test_client_status_and_cancel() -> None:
    run = FakeRun({"scontrol": (0, fixture("scontrol_cancelled.txt"), ""), "scancel": (0, "", "")})
    client = SlurmClient(run=run)
    assert client.status("2").state == "CANCELLED"
    client.cancel("2", signal="USR2")
    assert run.calls[-1] == ["scancel", "--signal=USR2", "2"]
    gone = FakeRun({"scontrol": (1, "", "slurm_load_jobs error: Invalid job id specified"), "scancel": (0, "", "")})
    with pytest.raises(SlurmError, match=r"job 999 is unknown to Slurm"):
        SlurmClient(run=gone).cancel("999")  # scancel itself says nothing and exits 0 for an unknown id
    assert [call[0] for call in gone.calls] == ["scontrol"]
    with pytest.raises(SlurmError, match=r"job 77 is unknown to Slurm.*HINT: it may have finished more than "
                                         "MinJobAge ago"):
        SlurmClient(run=gone).status("77")


def test_missing_binary_is_a_slurm_error() -> None:
    with pytest.raises(SlurmError, match=r"sbatch-not-here not found on PATH\. HINT: run this on a Slurm"):
        run_command(["sbatch-not-here", "--version"])


def test_script_lint_submit_work_without_torch(tmp_path: Path, without_torch: WithoutTorch) -> None:
    script = without_torch("script", "--nodes", "2", "--gpus-per-node", "4", "train.py", "--lr", "1", cwd=tmp_path)
    assert script.returncode == 0, script.stderr
    assert "#SBATCH --ntasks-per-node=4" in script.stdout and "python train.py --lr 1" in script.stdout
    (tmp_path / "job.sbatch").write_text(script.stdout)
    lint = without_torch("lint", "job.sbatch", cwd=tmp_path)
    assert (lint.returncode, lint.stdout) == (0, "job.sbatch: ok\n"), lint.stderr
    # submit needs sbatch: a stand-in that prints what the real one printed (the real one: cluster tests)
    (tmp_path / "train.py").write_text("")  # submit refuses a script that is not there
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 3\n")
    (bin_dir / "sbatch").chmod(0o755)
    submit = without_torch("submit", "--name", "t", "train.py", cwd=tmp_path, path=f"{bin_dir}:/usr/bin:/bin")
    assert submit.returncode == 0, submit.stderr
    assert "submitted job 3" in submit.stdout and f"output: {tmp_path}/torchslurm-runs/t/t-3.out" in submit.stdout
    assert (tmp_path / "torchslurm-runs" / "t" / "t.sbatch").exists()


def test_lint_cli_exit_code_on_errors(tmp_path: Path, without_torch: WithoutTorch) -> None:
    seed = Path(__file__).parents[2] / "fixtures" / "seed_scripts" / "seed000_pytorch_distributed.sbatch"
    result = without_torch("lint", str(seed), cwd=tmp_path)
    assert result.returncode == 1
    assert "error: [hard-coded-master-addr] line 16: MASTER_ADDR=your_master_node_ip is fixed" in result.stdout


def test_script_cli_refuses_errors(tmp_path: Path, without_torch: WithoutTorch) -> None:
    result = without_torch("script", "--gpus-per-node", "4", "--tasks-per-node", "1", "t.py", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert "error: [tasks-vs-gpus]" in result.stderr and "HINT: set --tasks-per-node 4" in result.stderr


def test_slurm_flags_after_the_script_are_refused_unless_forced(tmp_path: Path, without_torch: WithoutTorch) -> None:
    result = without_torch("script", "t.py", "--nodes", "4", "--lr", "0.1", "--time=10", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert ("error: [misplaced-flag] --nodes comes after t.py, so t.py gets it and the job spec does not. "
            "HINT: put torchslurm's flags before the script (--nodes ... t.py ...); if t.py itself takes "
            "--nodes, give --force before t.py") in result.stderr
    assert "[misplaced-flag] --time comes after t.py" in result.stderr and "--lr" not in result.stderr
    forced = without_torch("script", "--force", "t.py", "--nodes", "4", cwd=tmp_path)
    assert forced.returncode == 0 and "t.py --nodes 4" in forced.stdout and "--nodes=1" in forced.stdout
    placed = without_torch("script", "--nodes", "4", "t.py", "--lr", "0.1", cwd=tmp_path)
    assert placed.returncode == 0 and "--nodes=4" in placed.stdout and "misplaced" not in placed.stderr


def test_a_setup_line_that_breaks_bash_is_an_error_before_sbatch(tmp_path: Path, without_torch: WithoutTorch) -> None:
    broken = without_torch("script", "--setup", 'echo "hi', "t.py", cwd=tmp_path, path="/usr/bin:/bin")
    assert broken.returncode == 2 and broken.stdout == ""
    assert "error: [shell-syntax] the rendered script is not valid bash: bash: line " in broken.stderr
    assert "unexpected EOF while looking for matching" in broken.stderr
    assert "HINT: check the setup lines" in broken.stderr and "`torchslurm script --force ...`" in broken.stderr
    fine = without_torch("script", "--setup", 'echo "hi"', "--env", 'A=b"c', "t.py", cwd=tmp_path, path="/usr/bin:/bin")
    assert fine.returncode == 0 and "shell-syntax" not in fine.stderr


def test_show_job_takes_the_first_record_of_an_array() -> None:
    line = fixture("scontrol_running.txt").strip()
    two = line + "\n" + line.replace("JobId=1 ", "JobId=7 ") + "\n"
    assert SlurmClient(run=FakeRun({"scontrol": (0, two, "")})).show_job("1")["JobId"] == "1"


@pytest.mark.parametrize("command", ["script", "submit", "status", "logs", "cancel", "lint"])
def test_help_without_torch(command: str, tmp_path: Path, without_torch: WithoutTorch) -> None:
    result = without_torch(command, "--help", cwd=tmp_path)
    assert result.returncode == 0 and "usage: torchslurm" in result.stdout, result.stderr


def test_run_command_status_says_not_found_and_timeouts_without_raising(tmp_path: Path) -> None:
    missing = run_command_status(["sbatch-not-here", "--version"])
    assert (missing.returncode, missing.stdout) == (NOT_FOUND, "")
    assert missing.stderr.startswith("sbatch-not-here: No such file or directory")
    hung = run_command_status(["sleep", "5"], 0.2)
    assert hung.returncode == TIMED_OUT and "no answer within 0.2 s" in hung.stderr
    ran = run_command_status(["sh", "-c", "pwd; echo oops >&2; exit 3"], cwd=tmp_path)
    assert (ran.returncode, ran.stdout, ran.stderr) == (3, f"{tmp_path}\n", "oops\n")


def test_run_command_raises_what_run_command_status_returns() -> None:
    with pytest.raises(SlurmError, match=r"^sleep 5 did not answer within 0\.2 s\. HINT: check that slurmctld"):
        run_command(["sleep", "5"], 0.2)


def test_partition_nodes_through_the_seam() -> None:
    rows = fixture("sinfo_nodes.txt") + "gpu1\tgpu\t64\tgpu:8\t512000\n"
    run = FakeRun({"sinfo": (0, rows, "")})
    assert [n.name for n in SlurmClient(run=run).partition_nodes()] == ["node1", "node2", "node3", "node4"]
    assert run.calls[-1] == ["sinfo", "-h", "-N", "-o", SINFO_FORMAT]
    SlurmClient(run=run).partition_nodes("gpu")
    assert run.calls[-1][-2:] == ["-p", "gpu"]
    assert SlurmClient(run=FakeRun({"sinfo": (1, "", "Unable to contact slurm controller")})).partition_nodes() is None


def test_end_time_is_scontrol_s_end_time_in_local_time() -> None:
    fields = parse_scontrol(fixture("scontrol_running.txt"))
    assert end_time_from_scontrol(fields) == datetime(2026, 11, 25, 22, 32, 24).timestamp()
    assert end_time_from_scontrol(parse_scontrol("JobId=1 EndTime=Unknown Deadline=N/A")) is None
    assert end_time_from_scontrol(parse_scontrol("JobId=1")) is None
    run = FakeRun({"scontrol": (0, fixture("scontrol_running.txt"), "")})
    assert SlurmClient(run=run).end_time("1") == end_time_from_scontrol(fields)
    assert run.calls == [["scontrol", "show", "job", "-o", "1"]]


def test_requeue_runs_scontrol_and_a_refusal_carries_its_fix() -> None:
    run = FakeRun({"scontrol": (0, "", "")})
    SlurmClient(run=run).requeue("1040_3")
    assert run.calls == [["scontrol", "requeue", "1040_3"]]
    SlurmClient(run=FakeRun({"scontrol": (-15, "", "")})).requeue("17")  # ended by the requeue's own SIGTERM
    refused = FakeRun({"scontrol": (1, "", "scontrol_requeue error: Requested operation is presently disabled")})
    with pytest.raises(SlurmError, match=r"^`scontrol requeue 9` failed \(1\): .*presently disabled\. HINT: submit "
                       r"with --requeue"):
        SlurmClient(run=refused).requeue("9")


def test_excluded_nodes_are_read_and_written_through_the_seam() -> None:
    assert status_from_scontrol(parse_scontrol(fixture("scontrol_excluded.txt"))).excluded == "node[3-4]"
    assert status_from_scontrol(parse_scontrol(fixture("scontrol_running.txt"))).excluded == ""  # (null)
    run = FakeRun({"scontrol": (0, "", "")})
    SlurmClient(run=run).exclude_nodes("31", "node[2-4]")
    assert run.calls == [["scontrol", "update", "JobId=31", "ExcNodeList=node[2-4]"]]
    killed = FakeRun({"scontrol": (-15, "", "")})  # by the SIGTERM of the job's own requeue: tried once more
    with pytest.raises(SlurmError, match=r"^scontrol update JobId=31 ExcNodeList=node2 failed \(-15\)"):
        SlurmClient(run=killed).exclude_nodes("31", "node2")
    assert len(killed.calls) == 2
    running = FakeRun({"scontrol": (1, "", "Job is no longer pending execution for job 31")})  # seen on the sandbox
    with pytest.raises(SlurmError, match=r"no longer pending execution.*HINT: Slurm changes ExcNodeList only while"):
        SlurmClient(run=running).exclude_nodes("31", "node2")


def test_a_stopping_ranks_command_survives_a_sigterm_to_the_ranks_process_group() -> None:
    """torchrun's agent ends its workers with killpg(SIGTERM); a rank's `scontrol requeue` under way
    was killed with them, its -SIGTERM taken for Slurm's own, and the job ended FAILED, not requeued."""
    rank = "\n".join([
        "import os, signal, threading",
        "from torchslurm.jobs.slurm import run_command_status",
        "signal.signal(signal.SIGTERM, lambda *_: None)  # a rank handles SIGTERM (preemption)",
        "threading.Timer(0.3, os.killpg, (os.getpgid(0), signal.SIGTERM)).start()  # the agent",
        "result = run_command_status(['sh', '-c', 'sleep 1; echo reached Slurm'], timeout_s=20)",
        "print(result.returncode, result.stdout.strip())",
    ])
    done = subprocess.run([sys.executable, "-c", rank], capture_output=True, text=True, timeout=60,
                          start_new_session=True)  # its own group: the SIGTERM stays away from pytest
    assert done.stdout.strip() == "0 reached Slurm", done.stdout + done.stderr
