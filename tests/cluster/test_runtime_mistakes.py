"""The classic mistakes, made as a user makes them on the sandbox cluster, caught at run time with a
message that names the cause (and by `torchslurm doctor`): `torchrun --standalone` on two nodes, a
batch script that exports RANK, GPUs from Slurm with a CPU-only torch (the sandbox's fake GPUs), and
--cpus-per-task that a plain srun would not pass on (Slurm >= 22.05).

One job makes them all, one step after another (a job costs ~10 s of sandbox start-up each); the
tests read its outputs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.cluster

README_SCRIPT = Path(__file__).parents[1] / "multiproc" / "scripts" / "readme_trainer.py"


class Mistakes:
    def __init__(self, cluster: Cluster, job: str, state: str) -> None:
        self.cluster, self.job, self.state = cluster, job, state
        self.output = cluster.output(job)

    def exit_code(self, step: str) -> int:
        return self.cluster.echoed_exit(self.job, step)

    def text(self, pattern: str) -> str:
        return self.cluster.text(pattern)

    def reports(self, pattern: str) -> list[dict[str, Any]]:
        """The doctor's JSON reports in those files, by rank."""
        lines = [line for line in self.text(pattern).splitlines() if line.startswith("{")]
        return sorted((json.loads(line) for line in lines), key=lambda r: r["rank"] if r["rank"] is not None else -1)


@pytest.fixture(scope="module")
def mistakes(cluster_factory: Callable[[Path], Cluster], tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Mistakes]:
    cluster = cluster_factory(tmp_path_factory.mktemp("mistakes"))
    d = cluster.job_dir
    script = f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --cpus-per-task=2 --gpus-per-node=2
export TORCH_CPP_LOG_LEVEL=ERROR
py={cluster.python}
# 1. torchrun --standalone under srun on two nodes: two separate trainings, one run_dir
srun --output={d}/standalone-%t.out $py -m torch.distributed.run --standalone --nproc-per-node=2 \\
  {README_SCRIPT} {d}/standalone 1
echo "standalone exit $?"
srun --output={d}/standalone-doctor-%t.json $py -m torch.distributed.run --standalone --nproc-per-node=1 \\
  -m torchslurm doctor --json
# 4. RANK exported in the batch script
export RANK=$SLURM_PROCID
srun --output={d}/rank-%t.out $py {README_SCRIPT} {d}/rank 1
echo "rank-srun exit $?"
torchslurm run {README_SCRIPT} {d}/rank 1 > {d}/rank-run.out 2>&1
echo "rank-run exit $?"
srun --output={d}/rank-doctor-%t.json $py -m torchslurm doctor --json
unset RANK
# 3. GPUs from Slurm, torch without CUDA (this torch is a CPU build; the GPUs are fake)
torchslurm train run_dir={d}/gpu epochs=1 > {d}/gpu-train.out 2>&1
echo "gpu-train exit $?"
srun --output={d}/gpu-init-%t.out $py -c "import torchslurm; torchslurm.init().env.rank; torchslurm.shutdown()"
echo "gpu-init exit $?"
# doctor in the batch shell itself: the unseen GPUs, and srun steps without SRUN_CPUS_PER_TASK
torchslurm doctor --json > {d}/batch-doctor.json
echo "batch-doctor exit $?"
# 9. doctor --ranks from the batch shell: its ranks are srun tasks
torchslurm doctor --ranks --json > {d}/ranks-doctor.json
echo "ranks-doctor exit $?"
"""
    job = cluster.sbatch(script)
    state = cluster.wait(job, timeout_s=300)
    yield Mistakes(cluster, job, state)
    cluster.cancel_running()


def test_torchrun_standalone_on_two_nodes_is_refused_before_either_trains(mistakes: Mistakes) -> None:
    assert mistakes.exit_code("standalone") != 0
    text = mistakes.text("standalone-*.out")
    expected = ("torchrun's world is 2 rank(s) on 1 node(s) (WORLD_SIZE=2, GROUP_WORLD_SIZE=1) but its srun step "
                "spans 2 nodes (SLURM_STEP_NUM_NODES=2): each node runs its own separate training")
    assert text.count(expected) >= 2, text[-4000:]  # on both nodes
    assert "--nnodes=2" in text
    assert not (mistakes.cluster.job_dir / "standalone").exists()  # nothing was written into the run_dir
    reports = mistakes.reports("standalone-doctor-*.json")
    assert len(reports) == 2, mistakes.text("standalone-doctor-*.json")[-4000:]
    for report in reports:
        placement = {c["name"]: c for c in report["checks"]}["placement"]
        assert placement["status"] == "fail" and "each node runs its own separate training" in placement["detail"]


def test_an_exported_rank_says_remove_the_export_under_srun_torchslurm_run_and_doctor(mistakes: Mistakes) -> None:
    remove = "remove the `export RANK=…` line"
    srun_text = mistakes.text("rank-[0-9].out")
    assert mistakes.exit_code("rank-srun") != 0
    assert "the job script exports RANK" in srun_text and remove in srun_text, srun_text[-4000:]
    assert "half a torchrun environment" not in srun_text
    run_text = mistakes.text("rank-run.out")
    assert mistakes.exit_code("rank-run") == 2
    assert run_text.startswith("error: RANK=0 is set in this Slurm batch shell but Slurm never sets RANK"), run_text
    assert remove in run_text and "start the script with torchrun or `torchslurm run`" not in run_text
    assert not (mistakes.cluster.job_dir / "rank" / "checkpoints").exists()
    reports = mistakes.reports("rank-doctor-*.json")
    assert len(reports) == 2
    for report in reports:
        placement = {c["name"]: c for c in report["checks"]}["placement"]
        assert placement["status"] == "fail" and "the job script exports RANK" in placement["detail"]
        assert remove in placement["hint"]


def test_gpus_from_slurm_with_a_cpu_only_torch_warn_in_init_and_stop_torchslurm_train(mistakes: Mistakes) -> None:
    train = mistakes.text("gpu-train.out")
    assert mistakes.exit_code("gpu-train") == 2, train
    assert train.startswith("error: Slurm gave this task GPUs (SLURM_GPUS_ON_NODE=2"), train
    assert "training would run on the CPU" in train and "TORCHSLURM_DEVICE=cpu" in train
    assert not (mistakes.cluster.job_dir / "gpu").exists()
    assert mistakes.exit_code("gpu-init") == 0
    warned = mistakes.text("gpu-init-*.out")
    assert warned.count("Slurm gave this task GPUs (SLURM_GPUS_ON_NODE=2") == 2, warned  # one per node


def test_doctor_ranks_started_by_srun_say_srun(mistakes: Mistakes) -> None:
    assert mistakes.exit_code("ranks-doctor") in (0, 1)
    reports = mistakes.reports("ranks-doctor.json")
    # one rank per allocated GPU on each node: 2 x 2, every one an srun task, none "torchrun"
    assert [(r["rank"], r["launcher"]) for r in reports] == [(rank, "srun") for rank in range(4)], reports
    gpus = {c["name"]: c for c in reports[0]["checks"]}["gpus"]
    assert gpus["status"] == "warn" and "TORCHSLURM_DEVICE=cpu" in gpus["hint"]


def test_doctor_in_the_batch_shell_finds_unseen_gpus_and_the_cpus_srun_would_not_pass_on(mistakes: Mistakes) -> None:
    assert mistakes.exit_code("batch-doctor") in (0, 1)
    [report] = mistakes.reports("batch-doctor.json")
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["gpus"]["status"] == "warn", checks["gpus"]
    assert checks["gpus"]["detail"].startswith("Slurm gave this task GPUs") and "torch sees no CUDA device" in \
        checks["gpus"]["detail"]
    assert checks["cpus"]["status"] == "warn" and "SLURM_CPUS_PER_TASK=2" in checks["cpus"]["detail"], checks["cpus"]
    assert "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK" in checks["cpus"]["hint"]
