"""Preemption, time limits and failures end to end on the sandbox: 2 nodes x 2 ranks, srun mode
(torchrun mode where a test says so), jobs from torchslurm's own sbatch renderer (preemptible:
--signal=USR2@grace, --requeue).

Every interrupted run is compared, bitwise, with one uninterrupted run of the same training.
Requeued jobs wait 120 s in PENDING (BeginTime); tests hurry them with
`scontrol update JobId=J StartTime=now` (scontrol(1): StartTime of a pending job).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from tests.multiproc.conftest import NETWORK, weights

from torchslurm.jobs.sbatch import render
from torchslurm.jobs.spec import JobSpec
from torchslurm.sandbox.config import veth_name
from torchslurm.train import checkpoint
from torchslurm.train.watchdog import EXIT_DEADLINE_S

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.cluster

SCRIPT = Path(__file__).parent.parent / "multiproc" / "scripts" / "preempt_train.py"
EXAMPLE = Path(__file__).parents[2] / "examples" / "mnist.py"
TRAINING = ("epochs=2", "samples=2000", "batch_size=16")  # 4 ranks: 25 optimizer steps per epoch
# Process group timeout of these jobs: the bound on how long a rank may hang, and how long ranks wait
# in init for their peers, well above the 4-20 s a rank takes to start on this loaded machine. The
# failures here are seen through closed connections, so a long bound costs no time.
TIMEOUT_S = 60


def job_script(cluster: Cluster, run_dir: Path, *args: str, time_limit: str = "5", preemptible: bool = True,
               torchrun_restarts: int | None = None, **env: str) -> str:
    """srun mode, 2 tasks per node; or, with torchrun_restarts, one torchrun per node running 2 ranks."""
    placement: dict[str, object] = (
        {"tasks_per_node": 2} if torchrun_restarts is None else
        {"launch": "torchrun", "nproc_per_node": 2, "cpus_per_task": 2, "max_restarts": torchrun_restarts})
    spec = JobSpec(script=str(SCRIPT), args=(f"run_dir={run_dir}", *TRAINING, f"timeout_s={TIMEOUT_S}", *args),
                   name="preempt", nodes=2, time=time_limit, preemptible=preemptible, **placement,  # type: ignore[arg-type]
                   grace_s=60, python=cluster.python,
                   # one thread per rank, as in every run compared here: the CPU kernels then sum in the
                   # same order and the weights can be compared bit for bit
                   env={"OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR", **env})
    return render(spec)


def drive(cluster: Cluster, job: str, timeout_s: float = 150) -> tuple[str, int]:
    """Wait until the job ends, starting it at once whenever it was requeued. → (state, restarts)."""
    deadline, hurried, requeued = time.monotonic() + timeout_s, 0.0, None
    while time.monotonic() < deadline:
        info = cluster.job(job)
        state, restarts = info.get("JobState", "?"), int(info.get("Restarts", "0") or 0)
        waiting = state == "PENDING" and info.get("Reason") == "BeginTime"
        requeued = (requeued or time.monotonic()) if waiting else None
        # Not in the second of the requeue: slurmd revoked the old run's credential then, and a start
        # within the same second is refused ("Killing non-startable batch job: Job credential revoked",
        # the job ends FAILED); the revocation came before the job was seen waiting, so over 1 s after
        # that is a later second. Then again and again: an update while the old run is still completing
        # is accepted but has no effect.
        if waiting and time.monotonic() - (requeued or 0) > 1 and time.monotonic() - hurried > 1:
            cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
            hurried = time.monotonic()
        elif state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return state, restarts
        time.sleep(0.2)
    raise AssertionError(f"job {job} did not finish within {timeout_s} s: {cluster.job(job)}")


def rank_pids(run_dir: Path, ranks: int = 4) -> dict[int, int]:
    """rank → pid of the current run (the script writes them; tasks are visible from here)."""
    found = {}
    for rank in range(ranks):
        path = run_dir / "pids" / f"rank{rank}.pid"
        if path.exists() and path.read_text().strip():
            found[rank] = int(path.read_text().split()[0])
    return found


def wait_for(what: Callable[[], object], timeout_s: float, message: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)


def stopped_once_and_requeued(cluster: Cluster, job: str) -> tuple[str, int]:
    """Drive a job signalled with USR2 to its end: it completed after one requeue, every rank
    stopped after the same step, and rank 0 requeued it. Its output and that step."""
    state, restarts = drive(cluster, job)
    output = cluster.output(job)
    assert (state, restarts) == ("COMPLETED", 1), output[-4000:]
    stops = set(re.findall(r"rank \d: stopped at step (\d+)", output))
    assert len(stops) == 1, output[-4000:]  # every rank stopped after the same step
    assert re.search(rf"stopped on SIGUSR2; requeued job {job} \(restart 1 of at most 3\)", output), output[-4000:]
    return output, int(stops.pop())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # the process may end between kill(0) and the read
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def threads(pid: int) -> list[str]:
    """name, state and kernel wait channel of each thread of a process (for failure messages)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            out.append(f"{(task / 'comm').read_text().strip()} {state} {(task / 'wchan').read_text().strip()}")
        except OSError:
            continue
    return out


def started(cluster: Cluster, job: str, run_dir: Path) -> dict[int, int]:
    wait_for(lambda: len(rank_pids(run_dir)) == 4, 90, f"job {job} did not start 4 ranks: {cluster.job(job)}")
    return rank_pids(run_dir)


def unstick(cluster: Cluster, node: str) -> None:
    """After a cut, Slurm 22.05 can leave the node COMPLETING with no job on it (slurmctld's
    terminate messages were lost), which blocks every later job; `scontrol reconfigure` clears it."""
    deadline = time.monotonic() + 10
    while "comp" in cluster.run(["sinfo", "-h", "-n", node, "-o", "%t"]).stdout:
        if time.monotonic() > deadline:
            cluster.run(["scontrol", "reconfigure"])
            return
        time.sleep(0.5)


class Reference:
    """The uninterrupted run, submitted once; `weights()` waits for it."""

    def __init__(self, cluster: Cluster, run_dir: Path) -> None:
        self.cluster, self.run_dir = cluster, run_dir
        self.job = cluster.sbatch(job_script(cluster, run_dir))
        self._weights: dict[str, torch.Tensor] | None = None

    def weights(self) -> dict[str, torch.Tensor]:
        if self._weights is None:
            state = self.cluster.wait(self.job, timeout_s=150)
            assert state == "COMPLETED", self.cluster.output(self.job)[-3000:]
            self._weights = weights(self.run_dir)
        return self._weights


@pytest.fixture(scope="module")
def reference(cluster_factory: Callable[[Path], Cluster], tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[Reference]:
    cluster = cluster_factory(tmp_path_factory.mktemp("reference"))
    yield Reference(cluster, cluster.job_dir / "run")
    cluster.cancel_running()


def assert_same_weights(reference: Reference, run_dir: Path) -> None:
    mine, theirs = weights(run_dir), reference.weights()
    different = [k for k in NETWORK if not torch.equal(mine[k], theirs[k])]
    assert not different, f"weights differ from the uninterrupted run in {different}"


def test_scancel_signal_mid_epoch_checkpoints_requeues_and_resumes_bitwise(
        cluster: Cluster, reference: Reference) -> None:
    """torchrun mode (the reference ran in srun mode: the same 4 ranks). The log tells the stop once:
    rank 0's lines, Slurm's own account of the requeue and srun's exit code 75 per node, but no
    traceback from the agents (which get Slurm's SIGTERM too), no `Exited with exit code 1`, and no
    rank cut short in its teardown by the requeue's SIGTERM."""
    run_dir = cluster.job_dir / "run"
    job = cluster.sbatch(job_script(cluster, run_dir, "step_sleep=0.15", "requeued_step_sleep=0", torchrun_restarts=0))
    started(cluster, job, run_dir)
    time.sleep(4.0)  # some steps into epoch 1 (start-up takes ~2 s of it)
    assert cluster.run(["scancel", "--signal=USR2", job]).returncode == 0
    output, step = stopped_once_and_requeued(cluster, job)
    assert 0 < step < 50
    # 0 completed steps lost: the resume starts at the very step the stop saved
    assert re.search(rf"Resuming from \S+step-{step:09d}: epoch \d, batch \d+, step {step}\b", output), output[-4000:]
    assert output.count("stopping at this step boundary: SIGUSR2") == 1, output[-4000:]
    noise = ("Traceback", "SignalException", "Exited with exit code 1", "death signal", "Job step aborted",
             "not every rank reached the final barrier")
    assert not [n for n in noise if n in output], output[-4000:]
    assert_same_weights(reference, run_dir)


def test_an_example_without_preemption_code_is_stopped_requeued_and_resumed(cluster: Cluster) -> None:
    """examples/mnist.py (on the bundled digits) has no preemption code: the Trainer's own catches
    Slurm's USR2 from a preemptible job, checkpoints, requeues, and the requeued job resumes.
    The signal goes out after the first step and the ranks stop within a second of it (delivery, then
    at most two 0.2 s checks); the 3 epochs (36 steps, a validation and a checkpoint each) last far
    longer than that, about 15 s on a 2-core machine, so it lands while the job trains."""
    run_dir = cluster.job_dir / "run"
    spec = JobSpec(script=str(EXAMPLE), args=("--epochs", "3", "dataset=digits", "log_every=1", f"run_dir={run_dir}"),
                   name="example", nodes=2, tasks_per_node=2, time="5", preemptible=True, grace_s=60,
                   python=cluster.python, env={"TORCH_CPP_LOG_LEVEL": "ERROR"})
    job = cluster.sbatch(render(spec))
    metrics = run_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and '"kind": "step"' in metrics.read_text(), 90, "no step was logged")
    assert cluster.run(["scancel", "--signal=USR2", job]).returncode == 0
    state, restarts = drive(cluster, job, timeout_s=300)  # slow on a loaded machine
    output = cluster.output(job)
    assert (state, restarts) == ("COMPLETED", 1), output[-4000:]
    assert "stopping at this step boundary: SIGUSR2" in output, output[-4000:]
    assert re.search(rf"stopped on SIGUSR2; requeued job {job} \(restart 1 of at most 3\)", output), output[-4000:]
    assert re.search(r"Resuming from \S+step-\d+: epoch \d+, batch \d+, step \d+", output), output[-4000:]
    assert "final validation accuracy" in output, output[-4000:]


@pytest.mark.alone  # each run must start within the 28 s a 1-minute limit leaves it: no other load
def test_short_time_limit_finishes_over_several_requeues(cluster: Cluster, reference: Reference) -> None:
    """--time=1 and a 32 s grace: the trainer's own deadline (EndTime from `scontrol show job`,
    Slurm 22.05 sets no SLURM_JOB_END_TIME) stops each run 28 s after its start, start-up included.
    At 1.3 s a step a run makes at most 21 of the 50 steps however fast the machine is, so the job
    needs at least 3 runs (2 requeues). No --signal here: Slurm's signal timer may fire up to 60 s
    early, i.e. at any moment of a 1-minute job."""
    run_dir = cluster.job_dir / "run"
    job = cluster.sbatch(job_script(cluster, run_dir, "step_sleep=1.3", time_limit="1", preemptible=False,
                                    TORCHSLURM_GRACE_S="32", TORCHSLURM_MAX_REQUEUES="12"),
                        "--open-mode=append")  # keep every run's log in one file
    state, restarts = drive(cluster, job, timeout_s=900)  # start-up takes 4-20 s of each run under load
    output = cluster.output(job)
    assert state == "COMPLETED", output[-4000:]
    assert restarts >= 2, output[-4000:]
    assert output.count("stopping at this step boundary: the deadline (32 s before the time limit)") >= 2  # rank 0
    assert len(re.findall(r"Resuming from", output)) == restarts
    assert_same_weights(reference, run_dir)


def test_kill_9_of_one_rank_ends_all_ranks_names_it_and_the_requeued_job_completes(
        cluster: Cluster, reference: Reference) -> None:
    run_dir = cluster.job_dir / "run"
    job = cluster.sbatch(job_script(cluster, run_dir, "step_sleep=0.1", "requeued_step_sleep=0",
                                    "checkpoint_every_steps=10"))
    pids = started(cluster, job, run_dir)
    wait_for(lambda: checkpoint.complete(run_dir / "checkpoints"), 60, "no checkpoint was written")
    host = (run_dir / "pids" / "rank3.pid").read_text().split()[1]
    os.kill(pids[3], 9)
    others = [pids[r] for r in (0, 1, 2)]
    wait_for(lambda: not any(alive(p) for p in others), TIMEOUT_S + 20,
             f"ranks still running {TIMEOUT_S + 20} s after rank 3 was killed")
    state, restarts = drive(cluster, job)
    output = cluster.output(job)
    assert (state, restarts) == ("COMPLETED", 1), output[-4000:]
    assert f"error: rank 3 on {host} (" in output and ") stopped responding (no heartbeat)" in output, output[-4000:]
    assert re.search(r"task 3: Killed", output), output[-4000:]
    assert "requeued job" in output and "after a peer failure" in output
    assert_same_weights(reference, run_dir)


def test_torchrun_mode_restarts_after_a_kill_9_then_requeues_when_restarts_are_used_up(
        cluster: Cluster, reference: Reference) -> None:
    """torchrun --max-restarts=1. First kill -9 of rank 3: the agents restart all workers, which
    resume from the last checkpoint (no requeue). Second kill: no restarts left, so the workers
    requeue the job, and the requeued job resumes and completes."""
    run_dir, ckpt = cluster.job_dir / "run", cluster.job_dir / "run" / "checkpoints"
    job = cluster.sbatch(job_script(cluster, run_dir, "step_sleep=0.2", "requeued_step_sleep=0",
                                    "checkpoint_every_steps=10", torchrun_restarts=1))
    first = started(cluster, job, run_dir)
    wait_for(lambda: len(checkpoint.complete(ckpt)) == 1, 90, "training never reached step 10")
    os.kill(first[3], 9)
    wait_for(lambda: rank_pids(run_dir).get(3) not in (None, first[3]), 90, "rank 3 was not restarted")
    restarted = started(cluster, job, run_dir)
    resumed_from = checkpoint.complete(ckpt)[-1][0]  # the old workers are gone: nothing newer comes from them
    wait_for(lambda: checkpoint.complete(ckpt)[-1][0] > resumed_from, 90,
             f"the restarted run never saved a checkpoint after step {resumed_from}")
    host = (run_dir / "pids" / "rank3.pid").read_text().split()[1]
    os.kill(restarted[3], 9)
    state, restarts = drive(cluster, job)
    output = cluster.output(job)
    assert (state, restarts) == ("COMPLETED", 1), output[-4000:]
    resumed = [int(step) for step in re.findall(r"Resuming from \S+step-(\d+)", output)]
    # from step 10, then from 20 (a later checkpoint when this loaded machine was slow to kill)
    assert len(resumed) == 2 and 10 <= resumed[0] < resumed[1], output[-4000:]
    assert f"rank 3 on {host} (" in output and ") stopped responding (no heartbeat)" in output, output[-4000:]
    assert "requeued job" in output and "after a peer failure" in output, output[-4000:]
    assert_same_weights(reference, run_dir)


def test_kill_9_during_checkpoint_write_resumes_from_the_previous_one(cluster: Cluster, reference: Reference) -> None:
    run_dir = cluster.job_dir / "run"
    ckpt = run_dir / "checkpoints"
    job = cluster.sbatch(job_script(cluster, run_dir, "ballast_mb=64", "checkpoint_every_steps=8"))
    pids = started(cluster, job, run_dir)
    wait_for(lambda: checkpoint.complete(ckpt), 60, "the first checkpoint never completed")
    wait_for(lambda: list(ckpt.glob(".staging-000000016*")), 60, "the second checkpoint was never started")
    host = (run_dir / "pids" / "rank0.pid").read_text().split()[1]
    os.kill(pids[0], 9)  # rank 0 writes checkpoints: killed inside the save of step 16
    state, _ = drive(cluster, job)
    output = cluster.output(job)
    assert f"srun: error: {host}: task 0: Killed" in output, output[-4000:]
    # The survivors requeue before srun's SIGKILL, which follows its SIGTERM after KillWait (30 s).
    assert state == "COMPLETED", output[-4000:]
    resumed = re.findall(r"Resuming from \S+step-(\d+)", output)
    assert resumed in (["000000008"], ["000000016"]), output[-4000:]  # 16 only if the rename beat the kill
    assert_same_weights(reference, run_dir)


def test_network_cut_of_a_node_ends_every_rank_within_the_bound(cluster: Cluster, reference: Reference) -> None:
    """`ip link set <veth> down` on the root side of the second node's link: ranks on the first node
    time out in their collective, name the silent ranks, requeue the job, and it completes."""
    run_dir = cluster.job_dir / "run"
    # a 10 s group timeout: the cut node's slurmd must not miss SlurmdTimeout (30 s) meanwhile
    job = cluster.sbatch(job_script(cluster, run_dir, "step_sleep=0.2", "requeued_step_sleep=0", "timeout_s=10",
                                    "checkpoint_every_steps=4"))
    pids = started(cluster, job, run_dir)
    wait_for(lambda: checkpoint.complete(run_dir / "checkpoints"), 60, "training never reached step 4")
    hosts = {r: (run_dir / "pids" / f"rank{r}.pid").read_text().split()[1] for r in range(4)}
    cut = hosts[2]
    assert hosts[0] != cut, hosts
    link = veth_name(int(cut.removeprefix("node")))
    assert cluster.run(["ip", "link", "set", link, "down"]).returncode == 0
    try:
        bound = 10 + EXIT_DEADLINE_S + 20  # group timeout + the watchdog's exit deadline + slack
        wait_for(lambda: not any(alive(p) for p in pids.values()), bound,
                 f"ranks still running {bound:g} s after {cut}'s network was cut (group timeout 10 s): "
                 f"{ {r: threads(p) for r, p in pids.items() if alive(p)} }")
    finally:
        cluster.run(["ip", "link", "set", link, "up"])
    # The resumed run must not land on the node that was cut while Slurm still cleans up the old
    # run there ("Job credential revoked"): keep it off that node, and unstick the node.
    deadline = time.monotonic() + 120
    while cluster.job(job).get("JobState") not in ("PENDING", "FAILED", "COMPLETED"):
        assert time.monotonic() < deadline, f"job {job} was neither requeued nor ended: {cluster.job(job)}"
        if time.monotonic() > deadline - 90:  # still COMPLETING on the cut node after 30 s: clear it
            unstick(cluster, cut)
        time.sleep(0.5)
    cluster.run(["scontrol", "update", f"JobId={job}", f"ExcNodeList={cut}"])
    unstick(cluster, cut)
    state, restarts = drive(cluster, job)
    output = cluster.output(job)
    assert (state, restarts) == ("COMPLETED", 1), output[-4000:]
    assert re.search(rf"0: error: ranks 2, 3 on {cut} \(\S+\) stopped responding", output), output[-4000:]
    # The group timeout ended the wait on node1. Which of its ranks timed out first varies: the other
    # then sees its pair close ("Connection closed by peer"), and rank 0 can be either.
    assert re.search(r"[01]: .*a collective failed \(Timed out waiting 10000ms", output), output[-4000:]
    assert "after a peer failure" in output
    assert_same_weights(reference, run_dir)
