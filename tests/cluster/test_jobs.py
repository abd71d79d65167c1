"""Jobs end to end on the sandbox cluster: `torchslurm submit/status/logs/cancel` and the Job API.

Set TORCHSLURM_RECORD_FIXTURES=1 to (re)write tests/fixtures/slurm_output/ from this run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from torchslurm.jobs.slurm import SlurmClient
from torchslurm.jobs.slurmoutput import SQUEUE_FORMAT, parse_scontrol, parse_squeue, status_from_scontrol
from torchslurm.jobs.spec import JobSpec
from torchslurm.jobs.submit import submit

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.cluster

PROBE = Path(__file__).with_name("job_probe.py")
FIXTURES = Path(__file__).parent.parent / "fixtures" / "slurm_output"
RECORD = os.environ.get("TORCHSLURM_RECORD_FIXTURES") == "1"


def record(name: str, text: str) -> None:
    if RECORD:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / name).write_text(text)


def cli(cluster: Cluster, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return cluster.run([cluster.python, "-m", "torchslurm", *args], timeout_s=timeout_s, cwd=cluster.job_dir)


def wait_for(cluster: Cluster, job_id: str, states: set[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    state = "?"
    while time.monotonic() < deadline:
        state = cluster.job(job_id).get("JobState", "?")
        if state in states:
            return state
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached {states}; last state {state}")


def probe_flags(cluster: Cluster, sleep_s: float, *extra: str) -> list[str]:
    return ["--python", cluster.python, "--env", f"PROBE_SLEEP_S={sleep_s}", "--time", "5", *extra]


def test_submit_status_logs_2x2(cluster: Cluster) -> None:
    stop = cluster.job_dir / "stop"  # the ranks stay up until the running job has been looked at
    result = cli(cluster, "submit", "--name", "probe", "--nodes", "2", "--tasks-per-node", "2",
                 *probe_flags(cluster, 60, "--env", f"PROBE_STOP_FILE={stop}"), "--run-dir", str(cluster.job_dir),
                 str(PROBE), "--epochs", "1")
    assert result.returncode == 0, result.stderr
    job_id = re.search(r"submitted job (\d+)", result.stdout).group(1)  # type: ignore[union-attr]
    cluster.job_ids.append(job_id)
    assert f"output: {cluster.job_dir}/probe-{job_id}.out" in result.stdout

    wait_for(cluster, job_id, {"RUNNING"})
    running = cli(cluster, "status", job_id)
    assert running.returncode == 0, running.stderr
    assert f"job {job_id} (probe): RUNNING" in running.stdout
    record("squeue_running.txt", cluster.run(["squeue", "-h", "-o", SQUEUE_FORMAT, "-j", job_id]).stdout)
    record("scontrol_running.txt", cluster.run(["scontrol", "show", "job", "-o", job_id]).stdout)
    stop.touch()

    assert cluster.wait(job_id, timeout_s=90) == "COMPLETED"
    done = cli(cluster, "status", job_id)
    assert f"job {job_id} (probe): COMPLETED" in done.stdout and "exit:     0:0" in done.stdout
    record("scontrol_completed.txt", cluster.run(["scontrol", "show", "job", job_id]).stdout)

    logs = cli(cluster, "logs", job_id)
    hosts = [m.group(1) for m in re.finditer(r"rank \d of 4 on (node\d)", logs.stdout)]
    assert len(hosts) == 4 and len(set(hosts)) == 2, logs.stdout
    rank3 = cli(cluster, "logs", job_id, "--rank", "3").stdout
    assert re.match(r"rank 3 of 4 on node\d", rank3) and "rank 3 done" in rank3
    assert "rank 2" not in rank3


def test_cancel_stops_a_running_job(cluster: Cluster) -> None:
    job = submit(JobSpec(script=str(PROBE), name="to-cancel", nodes=2, tasks_per_node=2, python=cluster.python,
                         env={"PROBE_SLEEP_S": "120"}, time="5"),
                 run_dir=cluster.job_dir, client=SlurmClient(environ=cluster.environ))
    cluster.job_ids.append(job.id)
    wait_for(cluster, job.id, {"RUNNING"})
    record("squeue_user.txt", cluster.run(["squeue", "-h", "-o", SQUEUE_FORMAT]).stdout)
    queue = cli(cluster, "status")
    # other test sessions share the sandbox: the job may land on any two nodes
    assert re.search(rf"^{job.id}\s+RUNNING .* node\S+\s+to-cancel$", queue.stdout, re.M), queue.stdout
    result = cli(cluster, "cancel", job.id)
    assert result.returncode == 0, result.stderr
    final = job.wait(timeout_s=60, poll_s=0.2)
    assert final.state == "CANCELLED" and final.finished
    record("scontrol_cancelled.txt", cluster.run(["scontrol", "show", "job", "-o", job.id]).stdout)
    assert "rank 0 done" not in job.logs()


def test_pending_job_and_unknown_job(cluster: Cluster) -> None:
    client = SlurmClient(environ=cluster.environ)
    script = cluster.job_dir / "held.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --hold --output={cluster.job_dir}/held-%j.out\ntrue\n")
    sbatch = cluster.run(["sbatch", "--parsable", str(script)])
    record("sbatch_parsable.txt", sbatch.stdout)
    job_id = sbatch.stdout.strip()
    cluster.job_ids.append(job_id)
    (row,) = client.queue(job_id)
    assert (row.state, row.reason) == ("PENDING", "JobHeldUser")
    record("squeue_pending.txt", cluster.run(["squeue", "-h", "-o", SQUEUE_FORMAT, "-j", job_id]).stdout)
    client.cancel(job_id)
    assert client.queue("999999") == []
    gone = cluster.run(["squeue", "-h", "-j", "999999"])
    record("squeue_invalid_job.stderr", gone.stderr)
    record("sbatch_version.txt", cluster.run(["sbatch", "--version"]).stdout)


def test_live_outputs_parse(cluster: Cluster) -> None:
    """The parsers on what this Slurm prints right now (the fixtures are a snapshot of the same)."""
    job_id = cluster.sbatch("#!/bin/bash\n#SBATCH --job-name='a b'\nsleep 30\n")
    wait_for(cluster, job_id, {"RUNNING"})
    (row,) = parse_squeue(cluster.run(["squeue", "-h", "-o", SQUEUE_FORMAT, "-j", job_id]).stdout)
    st = status_from_scontrol(parse_scontrol(cluster.run(["scontrol", "show", "job", job_id]).stdout))
    assert (row.job_id, row.state, row.name) == (job_id, "RUNNING", "a b")  # sbatch 22.05 groups '...'
    assert (st.job_id, st.state, st.name) == (job_id, "RUNNING", "a b") and re.fullmatch(r"node\d", st.nodes)


def test_hostile_values_reach_slurm_and_python_as_data(cluster: Cluster) -> None:
    name = 'run "x" #1; $(touch pwned) `id`'
    args = ["a b", "$(touch pwned)", "`touch pwned`", "; touch pwned", "it's", '"q"', "#not-comment", ""]
    job = submit(JobSpec(script=str(PROBE), name=name, args=tuple(args), nodes=1, python=cluster.python,
                         time="5"), run_dir=cluster.job_dir, client=SlurmClient(environ=cluster.environ))
    cluster.job_ids.append(job.id)
    assert job.wait(timeout_s=60, poll_s=0.2).state == "COMPLETED"
    assert job.status().name == name
    line = next(x for x in job.logs().splitlines() if "argv=" in x)
    assert json.loads(line.split("argv=", 1)[1]) == args
    assert not list(cluster.job_dir.rglob("pwned")) and not Path("pwned").exists()


@pytest.mark.parametrize("launch", ["srun", "torchrun"])
def test_a_python_command_of_several_words_runs_every_rank_through_it(cluster: Cluster, launch: str) -> None:
    """python as a container's command (`apptainer exec --nv image.sif python`), here `env VAR='a b' python`:
    each word reaches srun (or torchrun's agent) as one argument, quoted, on both nodes."""
    layout = {"nproc_per_node": 1} if launch == "torchrun" else {"tasks_per_node": 1}
    job = submit(JobSpec(script=str(PROBE), name=f"wrapped-{launch}", nodes=2, launch=launch, time="5",
                         python=f"env 'PROBE_WRAPPED=in a container' {cluster.python}", **layout),  # type: ignore[arg-type]
                 run_dir=cluster.job_dir, client=SlurmClient(environ=cluster.environ))
    cluster.job_ids.append(job.id)
    assert job.wait(timeout_s=90, poll_s=0.2).state == "COMPLETED", job.logs()
    assert sorted(re.findall(r"rank (\d) wrapped=in a container\n", job.logs())) == ["0", "1"], job.logs()


def test_torchrun_mode_signal_reaches_workers_not_agent(cluster: Cluster) -> None:
    """--signal without B: reaches the workers under torchrun; the agent ignores it and lives on."""
    job = submit(JobSpec(script=str(PROBE), name="trsig", nodes=2, launch="torchrun", nproc_per_node=2,
                         cpus_per_task=2, python=cluster.python, time="5", preemptible=True, grace_s=60, signal="USR2",
                         # up until the signal (or 60 s), then 2 s more: the agent must outlive the signal
                         env={"PROBE_SLEEP_S": "60", "PROBE_AFTER_SIGNAL_S": "2"}),
                 run_dir=cluster.job_dir, client=SlurmClient(environ=cluster.environ))
    cluster.job_ids.append(job.id)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # all four workers up (torchrun + rendezvous take a few s)
        text = Path(job.status().stdout).read_text() if Path(job.status().stdout).exists() else ""
        if len(re.findall(r"rank \d of 4 on", text)) == 4:
            break
        time.sleep(0.2)
    result = cli(cluster, "cancel", job.id, "--signal", "USR2")
    assert result.returncode == 0, result.stderr
    final = job.wait(timeout_s=90, poll_s=0.5)
    text = job.logs()
    assert final.state == "COMPLETED", text
    assert sorted(re.findall(r"rank (\d) got SIGUSR2", text)) == ["0", "1", "2", "3"], text
    assert len(re.findall(r"rank \d done", text)) == 4, text


@pytest.mark.parametrize("launch", ["torchrun"])  # srun mode: test_submit_mnist_example_2x2
def test_generated_script_trains_across_two_nodes(cluster: Cluster, launch: str) -> None:
    """2 nodes x 2 ranks: every rank joins one process group; the script names no master."""
    extra = ["--nproc-per-node", "2", "--cpus-per-task", "2"] if launch == "torchrun" else ["--tasks-per-node", "2"]
    result = cli(cluster, "submit", "--name", f"ddp-{launch}", "--nodes", "2", "--launch", launch,
                 "--backend", "gloo", "--python", cluster.python, "--time", "5", "--env", "TORCH_CPP_LOG_LEVEL=ERROR",
                 *extra, "--run-dir", str(cluster.job_dir), str(PROBE.with_name("ddp_probe.py")))
    assert result.returncode == 0, result.stderr
    job_id = re.search(r"submitted job (\d+)", result.stdout).group(1)  # type: ignore[union-attr]
    cluster.job_ids.append(job_id)
    script = (cluster.job_dir / f"ddp-{launch}.sbatch").read_text()
    assert "MASTER_ADDR" not in script and "MASTER_PORT" not in script
    assert cluster.wait(job_id, timeout_s=120) == "COMPLETED", cluster.output(job_id)
    lines = re.findall(r"rank (\d) of 4 on (node\d) launcher=(\w+) master=(\S+) allreduce=(\S+)",
                       cli(cluster, "logs", job_id).stdout)
    assert sorted(r for r, *_ in lines) == ["0", "1", "2", "3"], cluster.output(job_id)
    hosts = sorted({h for _, h, *_ in lines})
    assert len(hosts) == 2  # other sessions share the sandbox: any two nodes
    assert {(lc, m.split(":")[0], a) for _, _, lc, m, a in lines} == {(
        "torchrun" if launch == "torchrun" else "srun", hosts[0], "10")}


def test_logs_follow_until_the_job_ends(cluster: Cluster) -> None:
    result = cli(cluster, "submit", "--name", "follow", "--nodes", "2", "--tasks-per-node", "1",
                 *probe_flags(cluster, 3), "--run-dir", str(cluster.job_dir), str(PROBE))
    job_id = re.search(r"submitted job (\d+)", result.stdout).group(1)  # type: ignore[union-attr]
    cluster.job_ids.append(job_id)
    followed = cli(cluster, "logs", job_id, "-f", "--poll-s", "0.2", timeout_s=90)
    assert followed.returncode == 0, followed.stderr
    assert sorted(re.findall(r"rank (\d) done", followed.stdout)) == ["0", "1"], followed.stdout
    assert cluster.job(job_id)["JobState"] == "COMPLETED"


def test_submit_mnist_example_2x2(cluster: Cluster) -> None:
    """Issue 5's done-when: `torchslurm submit` of the MNIST example (bundled digits) on 2 nodes x 2."""
    example = Path(__file__).parent.parent.parent / "examples" / "mnist.py"
    result = cli(cluster, "submit", "--name", "mnist", "--nodes", "2", "--tasks-per-node", "2", "--python",
                 cluster.python, "--time", "10", "--env", "TORCH_CPP_LOG_LEVEL=ERROR", "--run-dir",
                 str(cluster.job_dir), str(example), "--epochs", "2", "--lr", "0.1", "dataset=digits",
                 f"run_dir={cluster.job_dir / 'mnist-run'}")
    assert result.returncode == 0, result.stderr
    job_id = re.search(r"submitted job (\d+)", result.stdout).group(1)  # type: ignore[union-attr]
    cluster.job_ids.append(job_id)
    wait_for(cluster, job_id, {"RUNNING", "COMPLETED"})
    assert cluster.wait(job_id, timeout_s=180) == "COMPLETED", cluster.output(job_id)
    assert "COMPLETED" in cli(cluster, "status", job_id).stdout
    rank0 = cli(cluster, "logs", job_id, "--rank", "0").stdout
    assert "Starting distributed training on 4 processes (2 nodes × 2, gloo, cpu)" in rank0, rank0
    accuracy = re.search(r"final validation accuracy ([\d.]+)%", rank0)
    assert accuracy and float(accuracy.group(1)) > 10, rank0  # above chance (10 classes) after 2 epochs
