"""Correct launches from real users' jobs that must train on the sandbox cluster: task 0 on the second
node (SLURM_HOSTFILE with --distribution=arbitrary), ranks set per task by `srun bash -c` without
LOCAL_WORLD_SIZE, and --cpus-per-task reaching the srun steps through SRUN_CPUS_PER_TASK.

One job runs them all, one step after another (a job costs ~10 s of sandbox start-up each); the tests
read its outputs (each probe writes one JSON record per rank: tests/cluster/jobs/probe.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.cluster

PROBE = Path(__file__).parent / "jobs" / "probe.py"


class Job:
    def __init__(self, cluster: Cluster, job: str) -> None:
        self.cluster, self.job = cluster, job
        self.output = cluster.output(job)

    def exit_code(self, step: str) -> int:
        return self.cluster.echoed_exit(self.job, step)

    def text(self, pattern: str) -> str:
        return self.cluster.text(pattern)

    def records(self, step: int) -> list[dict[str, Any]]:
        """The probe's records of one step of this job, by rank."""
        found = [json.loads(p.read_text()) for p in self.cluster.job_dir.glob(f"probe-{self.job}-{step}-*.json")]
        return sorted(found, key=lambda r: r["rank"])


@pytest.fixture(scope="module")
def real(cluster_factory: Callable[[Path], Cluster], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    cluster = cluster_factory(tmp_path_factory.mktemp("real"))
    d = cluster.job_dir
    script = f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks=4 --cpus-per-task=2 --nodelist=node1,node2
export TORCH_CPP_LOG_LEVEL=ERROR
py={cluster.python}
# as `torchslurm script` writes it: Slurm >= 22.05 srun takes --cpus-per-task only from here
export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
# step 0. task 0 on node2, the step's second node: a hostfile and the arbitrary distribution
printf 'node2\\nnode2\\nnode1\\nnode1\\n' > {d}/hosts
SLURM_HOSTFILE={d}/hosts srun --distribution=arbitrary -n4 --output={d}/hostfile-%t.out $py {PROBE}
echo "hostfile exit $?"
# step 1. ranks set per task by bash -c, WORLD_SIZE and the master exported, no LOCAL_WORLD_SIZE
export WORLD_SIZE=$SLURM_NTASKS MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))
srun --output={d}/bash-c-%t.out bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID exec '$py' {PROBE}'
echo "bash-c exit $?"
unset WORLD_SIZE MASTER_ADDR MASTER_PORT
# step 2. the CPUs Slurm gave each task of a step
srun --output={d}/cpus-%t.out bash -c 'scontrol show step $SLURM_JOB_ID.$SLURM_STEP_ID | grep -o "TRES=[^ ]*"'
echo "cpus exit $?"
"""
    job = cluster.sbatch(script)
    cluster.wait(job, timeout_s=240)
    yield Job(cluster, job)
    cluster.cancel_running()


def test_task_0_on_the_second_node_trains_with_the_store_on_the_first(real: Job) -> None:
    assert real.exit_code("hostfile") == 0, real.text("hostfile-*.out")[-4000:]
    found = real.records(0)
    assert [(r["rank"], r["host"]) for r in found] == [(0, "node2"), (1, "node2"), (2, "node1"), (3, "node1")]
    assert {(r["world_size"], r["allreduce"]) for r in found} == {(4, 10.0)}
    assert {r["master_addr"] for r in found} == {"node1"}
    assert [r["rank"] for r in found if r["hosts_store"]] == [2]  # node1's first task, not rank 0
    assert "the store runs on node1 (the step's first node) in its first task" in found[0]["reason"]


def test_ranks_set_per_task_by_bash_c_train_across_two_nodes(real: Job) -> None:
    assert real.exit_code("bash-c") == 0, real.text("bash-c-*.out")[-4000:]
    found = real.records(1)
    assert [r["rank"] for r in found] == [0, 1, 2, 3]
    assert {(r["world_size"], r["allreduce"]) for r in found} == {(4, 10.0)}
    # the node layout comes from the srun step (2 ranks on each of 2 nodes), not "all 4 on one node"
    assert {(r["local_world_size"], r["num_nodes"], r["local_world_known"]) for r in found} == {(2, 2, True)}
    assert sorted((r["host"], r["local_rank"]) for r in found) == [
        ("node1", 0), ("node1", 1), ("node2", 0), ("node2", 1)]
    assert [r["rank"] for r in found if r["hosts_store"]] == [0]


def test_cpus_per_task_reaches_every_task_of_a_step(real: Job) -> None:
    assert real.exit_code("cpus") == 0, real.output[-4000:]
    steps = re.findall(r"TRES=cpu=(\d+),.*node=(\d+)", real.text("cpus-*.out"))
    assert steps and {(int(cpus), int(nodes)) for cpus, nodes in steps} == {(8, 2)}  # 4 tasks x 2 CPUs
