"""`torchslurm sweep` end to end on the sandbox: one array of five points (a 2x2 grid and a point
that fails), at most two tasks at a time. One sweep carries every check, as each task costs a few
seconds of start-up:

    grid seed: [7, 8] x step_sleep: [0, 0.2]   points 0-3; step_sleep slows a point, nothing else
    points: [{seed: 9, raise_at: "0:3"}]       point 4 raises at step 3

Point 1 (seed 7, slow) gets the preemption signal mid-training: it checkpoints, requeues itself
alone (the other tasks keep Restarts=0) and ends bitwise equal to point 0, its uninterrupted twin.
Point 4 ends failed with its error; `sweep` again submits point 4 alone. The training is
tests/multiproc/scripts/preempt_train.py on one rank per task (its own key=value args are listed
in the sweep's extra_keys).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from tests.multiproc.conftest import NETWORK, weights

from torchslurm.jobs.slurm import SlurmClient
from torchslurm.jobs.sweepstate import (
    PointState,
    TaskView,
    point_states,
    read_manifest,
    read_outcomes,
    slurm_tasks,
    tasks_from_scontrol,
)

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.cluster

SCRIPT = Path(__file__).parent.parent / "multiproc" / "scripts" / "preempt_train.py"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def spec_file(cluster: Cluster) -> Path:
    path = cluster.job_dir / "sweep.yaml"
    path.write_text(f"""
script: {SCRIPT}
args: [epochs=1, samples=400, batch_size=16, timeout_s=60, requeued_step_sleep=0]
name: sweep
time: "5"
preemptible: true
grace_s: 60
python: {cluster.python}
# one thread per rank: the CPU kernels sum in one order, so twins compare bit for bit
env: {{OMP_NUM_THREADS: "1", TORCH_CPP_LOG_LEVEL: ERROR}}
sweep:
  name: grid
  grid: {{seed: [7, 8], step_sleep: [0, 0.2]}}
  points: [{{seed: 9, step_sleep: 0, raise_at: "0:3"}}]
  max_parallel: 2
  extra_keys: [step_sleep, raise_at]
  run_dir: {cluster.job_dir / "runs"}
""")
    return path


def sweep(cluster: Cluster, spec: Path) -> subprocess.CompletedProcess[str]:
    result = cluster.run([cluster.python, "-m", "torchslurm", "sweep", "--spec", str(spec)], timeout_s=120,
                         cwd=cluster.job_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@dataclass
class Ran:
    cluster: Cluster
    sweep_dir: Path
    job: str
    tasks: dict[int, TaskView]
    states: list[PointState]
    throttle: set[str]
    spec: Path
    wall_s: float


def drive(cluster: Cluster, client: SlurmClient, job: str, signal: Callable[[dict[int, TaskView]], None],
          timeout_s: float = 240) -> dict[int, TaskView]:
    """Until every task has ended: `signal` looks at the tasks each round; a requeued task is started at
    once, more than 1 s after it was seen waiting (see test_preemption.drive: a start in the second of
    the requeue is refused as "Job credential revoked")."""
    deadline, seen_waiting, hurried = time.monotonic() + timeout_s, {}, 0.0
    while time.monotonic() < deadline:
        tasks = tasks_from_scontrol(client.show_jobs(job))
        signal(tasks)
        for index, task in tasks.items():
            waiting = task.state == "PENDING" and task.reason == "BeginTime"
            seen_waiting[index] = (seen_waiting.get(index) or time.monotonic()) if waiting else None
            since = seen_waiting[index]
            if since is not None and time.monotonic() - since > 1 and time.monotonic() - hurried > 1:
                cluster.run(["scontrol", "update", f"JobId={task.job_id}", "StartTime=now"])
                hurried = time.monotonic()
        if len(tasks) == 5 and all(t.state in FINAL for t in tasks.values()):
            return tasks
        time.sleep(0.2)
    raise AssertionError(f"sweep {job} did not end within {timeout_s} s: {client.show_jobs(job)}")


@pytest.fixture(scope="module")
def ran(cluster_factory: Callable[[Path], Cluster], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    cluster = cluster_factory(tmp_path_factory.mktemp("sweep"))
    started = time.monotonic()
    spec = spec_file(cluster)
    out = sweep(cluster, spec).stdout
    sweep_dir = cluster.job_dir / "runs" / "grid"
    manifest = read_manifest(sweep_dir)
    assert manifest is not None and len(manifest.submissions) == 1, out
    job = manifest.submissions[0].job_id
    cluster.job_ids.append(job)
    client = SlurmClient(environ=cluster.environ)
    log = sweep_dir / f"sweep-{job}_1.out"
    signalled: list[float] = []
    throttle = {r.get("ArrayTaskThrottle", "") for r in client.show_jobs(job)}

    def preempt_point_1(tasks: dict[int, TaskView]) -> None:
        if not signalled and log.exists() and "Starting distributed training" in log.read_text():
            signalled.append(time.monotonic())
        elif len(signalled) == 1 and time.monotonic() - signalled[0] > 1.0:  # some of its 20 steps in (0.2 s each)
            # Slurm 22.05 delivers the signal at once, but while tasks of the array still pend, scancel
            # keeps retrying ("Job can not be altered now, try again later") until its own timeout
            result = cluster.run(["timeout", "2", "scancel", "--signal=USR2", f"{job}_1"])
            assert result.returncode in (0, 124), result.stderr
            signalled.append(time.monotonic())

    try:
        tasks = drive(cluster, client, job, preempt_point_1)
        states = point_states(manifest, read_outcomes(manifest), slurm_tasks(manifest, client))
        yield Ran(cluster, sweep_dir, job, tasks, states, throttle, spec, time.monotonic() - started)
    finally:
        cluster.cancel_running()


def test_a_2x2_sweep_runs_as_one_array_two_at_a_time(ran: Ran) -> None:
    print(f"\nsweep of 5 points: {ran.wall_s:.1f} s")
    assert ran.throttle == {"2"}, ran.throttle  # --array=0-4%2
    assert [(s.index, s.dir, s.state) for s in ran.states[:4]] == [
        (0, "0-seed=7,step_sleep=0", "completed"), (1, "1-seed=7,step_sleep=0.2", "completed"),
        (2, "2-seed=8,step_sleep=0", "completed"), (3, "3-seed=8,step_sleep=0.2", "completed")]
    for state in ran.states[:4]:
        outcome = json.loads((ran.sweep_dir / state.dir / "outcome.json").read_text())
        assert (outcome["state"], outcome["epochs_done"]) == ("completed", 1), outcome
    assert not (weights(ran.sweep_dir / ran.states[0].dir)["net1.weight"] ==
                weights(ran.sweep_dir / ran.states[2].dir)["net1.weight"]).all()  # seeds 7 and 8 differ


def test_the_preempted_task_requeues_alone_and_ends_bitwise_equal_to_its_twin(ran: Ran) -> None:
    restarts = {i: (t.state, t.restarts) for i, t in ran.tasks.items()}
    assert restarts == {0: ("COMPLETED", 0), 1: ("COMPLETED", 1), 2: ("COMPLETED", 0), 3: ("COMPLETED", 0),
                        4: ("FAILED", 0)}, restarts
    log = (ran.sweep_dir / f"sweep-{ran.job}_1.out").read_text()
    assert f"stopped on SIGUSR2; requeued job {ran.job}_1 (restart 1 of at most 3)" in log, log[-3000:]
    resumed = re.search(r"Resuming from \S+step-0*(\d+): epoch 1, batch \d+, step \d+", log)
    assert resumed and 0 < int(resumed.group(1)) < 20, log[-3000:]  # mid-epoch: 20 steps to the epoch
    mine, twin = weights(ran.sweep_dir / ran.states[1].dir), weights(ran.sweep_dir / ran.states[0].dir)
    different = [k for k in NETWORK if not torch.equal(mine[k], twin[k])]
    assert not different, f"point 1 (preempted, resumed) differs from point 0 in {different}"


def test_a_failed_point_says_why_and_sweep_again_resubmits_it_alone(ran: Ran) -> None:
    failed = ran.states[4]
    assert (failed.dir, failed.state, failed.reason) == (
        "4-seed=9,step_sleep=0,raise_at=0_3", "failed", "ValueError: injected failure at step 3")
    out = sweep(ran.cluster, ran.spec).stdout
    manifest = read_manifest(ran.sweep_dir)
    assert manifest is not None
    again = manifest.submissions[-1]
    ran.cluster.job_ids.append(again.job_id)
    assert (len(manifest.submissions), again.indices) == (2, (4,)), out
    assert f"job {again.job_id}, array 4%2 (1 of 5 points)" in out, out
    client = SlurmClient(environ=ran.cluster.environ)
    assert sorted(tasks_from_scontrol(client.show_jobs(again.job_id))) == [4]
    ran.cluster.run(["scancel", again.job_id])
