"""The runtime end to end on the sandbox cluster (Gloo on CPU): srun ranks, torchrun in srun,
`torchslurm run` in a batch script, an unmodified torchrun-style script, GPU binding, two jobs at
once, 4 nodes. Every rank prints one JSON line (tests/cluster/jobs/*.py); the tests read them.

Re-record the Slurm GPU environments in tests/fixtures/slurm_env/ (read by the unit tests of
torchslurm.runtime.devices) with: TORCHSLURM_RECORD_SLURM_ENV=1 pytest tests/cluster/test_runtime_e2e.py -k gpu
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from torchslurm.sandbox.config import nic_name, node_addr

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.cluster

JOBS = Path(__file__).parent / "jobs"
PROBE, PLAIN, GPU_PROBE = JOBS / "probe.py", JOBS / "plain_ddp.py", JOBS / "gpu_probe.py"
TRAIN_PROBE = JOBS / "train_probe.py"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "slurm_env"
RECORD = os.environ.get("TORCHSLURM_RECORD_SLURM_ENV") == "1"
# Variables whose values must match the recording (job ids, paths and pids differ run to run).
GPU_KEYS = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS",
            "SLURM_GPUS_ON_NODE", "SLURMD_TRES_BIND", "SLURM_GPU_BIND", "SLURM_GPUS_PER_TASK",
            "SLURM_GPUS_PER_NODE", "SLURM_LOCALID", "SLURM_PROCID", "SLURMD_NODENAME")


def records(job_dir: Path, job: str = "*") -> list[dict[str, Any]]:
    """The probes' records (one file per rank, written in the job's working directory), by rank."""
    found = [json.loads(p.read_text()) for p in job_dir.glob(f"probe-{job}-*.json")]
    return sorted(found, key=lambda r: r["rank"])


def run_job(cluster: Cluster, script: str, *args: str, ranks: int, timeout_s: float = 180) -> list[dict[str, Any]]:
    job = cluster.sbatch(script, *args)
    state = cluster.wait(job, timeout_s=timeout_s)
    out = cluster.output(job)
    assert state == "COMPLETED", f"job {job} ended {state}:\n{out[-4000:]}"
    # the store client's reverse lookup of its dual-stack address (the sandbox's hosts file names it)
    assert "hostname of the client socket cannot be retrieved" not in out, out[-4000:]
    found = records(cluster.job_dir, job)
    assert [r["rank"] for r in found] == list(range(ranks)), out[-4000:]
    return found


def node_of(host: str) -> int:
    return int(host.removeprefix("node"))


def assert_one_group(found: list[dict[str, Any]], world_size: int) -> None:
    """Every rank was in the same group of world_size and computed the same sum."""
    expected = world_size * (world_size + 1) / 2
    assert {(r["world_size"], r["allreduce"]) for r in found} == {(world_size, expected)}


def assert_traffic_on_node_addresses(found: list[dict[str, Any]]) -> None:
    """Each rank's TCP connections (store + Gloo pairs) run between the nodes' own 198.18.0.x
    addresses, none over loopback, and ranks on different nodes are connected to each other."""
    for r in found:
        remotes = {c["remote"].rsplit(":", 1)[0] for c in r["connections"]}
        locals_ = {c["local"].rsplit(":", 1)[0] for c in r["connections"]}
        assert remotes, r
        assert all(a.startswith("198.18.0.") for a in remotes | locals_), (r["host"], remotes | locals_)
        assert locals_ == {node_addr(node_of(r["host"]))}, r
        others = {node_addr(node_of(o["host"])) for o in found if o["host"] != r["host"]}
        assert others <= remotes, (r["host"], remotes, others)


def test_srun_2x2_spans_both_nodes_over_each_nodes_own_nic(cluster: Cluster) -> None:
    found = run_job(cluster, f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2\nsrun python {PROBE}\n", ranks=4)
    assert_one_group(found, 4)
    assert [r["launcher"] for r in found] == ["srun"] * 4
    by_host = defaultdict(list)
    for r in found:
        by_host[r["host"]].append(r["local_rank"])
    assert len(by_host) == 2 and all(sorted(v) == [0, 1] for v in by_host.values()), by_host
    assert {r["master_addr"] for r in found} == {found[0]["host"]}
    # Different NIC names per node and no *_SOCKET_IFNAME from the user: whatever the runtime
    # chose must be this node's own NIC, and the traffic must prove it.
    for r in found:
        # (NCCL_SOCKET_IFNAME=<name> is NCCL's exact-match syntax.)
        assert {v.lstrip("=") for v in r["nic_vars"].values()} <= {nic_name(node_of(r["host"]))}, r
    assert_traffic_on_node_addresses(found)


def test_torchrun_in_srun_with_c10d_rendezvous_on_a_job_unique_port(cluster: Cluster) -> None:
    script = f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --cpus-per-task=2
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
# Job-unique port (a fixed 29500 lets a second job on this node join our rendezvous); below the
# ephemeral range and away from slurmd's 6818.
port=$((7000 + SLURM_JOB_ID % 2000))
srun torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=$head:$port \\
  --rdzv-id=$SLURM_JOB_ID {PROBE}
"""
    found = run_job(cluster, script, ranks=4)
    assert_one_group(found, 4)
    assert {r["launcher"] for r in found} == {"torchrun"}
    assert len({r["host"] for r in found}) == 2
    assert sorted((r["host"], r["local_rank"]) for r in found)[:2] == [(found[0]["host"], 0), (found[0]["host"], 1)]
    assert_traffic_on_node_addresses(found)


def test_torchslurm_run_in_a_batch_script_without_srun_uses_all_nodes(cluster: Cluster) -> None:
    found = run_job(cluster, f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2\ntorchslurm run {PROBE}\n", ranks=4)
    assert_one_group(found, 4)
    assert len({r["host"] for r in found}) == 2


def test_unmodified_torchrun_style_script_runs_across_two_nodes_through_torchslurm_run(cluster: Cluster) -> None:
    found = run_job(cluster, f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2\ntorchslurm run {PLAIN}\n", ranks=4)
    assert_one_group(found, 4)
    assert len({r["host"] for r in found}) == 2
    assert sorted(r["local_rank"] for r in found) == [0, 0, 1, 1]


def test_two_jobs_at_once_on_the_same_nodes_keep_their_own_rendezvous(cluster: Cluster) -> None:
    script = f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2 --nodelist=node1,node2\nsrun python {PROBE}\n"
    jobs = [cluster.sbatch(script), cluster.sbatch(script)]
    both_running, deadline = False, time.monotonic() + 60
    while not both_running and time.monotonic() < deadline:
        states = [cluster.job(j).get("JobState") for j in jobs]
        both_running = states == ["RUNNING", "RUNNING"]
        if "PENDING" not in states and not both_running and "RUNNING" not in states:
            break
        time.sleep(0.2)
    assert both_running, f"the two jobs never ran at the same time: {states}"
    results = []
    for job in jobs:
        assert cluster.wait(job, timeout_s=180) == "COMPLETED", cluster.output(job)[-4000:]
        found = records(cluster.job_dir, job)
        assert [r["rank"] for r in found] == [0, 1, 2, 3]
        assert_one_group(found, 4)
        assert {r["job_id"] for r in found} == {job}
        assert {r["host"] for r in found} == {"node1", "node2"}
        results.append({(r["master_addr"], r["master_port"]) for r in found})
    assert all(len(s) == 1 for s in results) and results[0] != results[1], results


def test_four_nodes_one_task_each(cluster: Cluster) -> None:
    cluster.require_nodes(4)
    found = run_job(cluster, f"#!/bin/bash\n#SBATCH --nodes=4 --ntasks-per-node=1\nsrun python {PROBE}\n", ranks=4)
    assert_one_group(found, 4)
    assert sorted(r["host"] for r in found) == ["node1", "node2", "node3", "node4"]
    assert_traffic_on_node_addresses(found)


GPU_CASES = {
    "srun_gpus_per_node2": ("srun --gpus-per-node=2", ["--gpus-per-node=2"]),
    "srun_gpus_per_task1": ("srun --gpus-per-task=1", ["--gpus-per-task=1"]),
    "srun_gpn4_bind_map_gpu_3_1": ("srun --gpus-per-node=4 --gpu-bind=map_gpu:3,1",
                                   ["--gpus-per-node=4", "--gpu-bind=map_gpu:3,1"]),
    "sbatch_gpus_per_task1_srun": ("sbatch --gpus-per-task=1, then srun with no GPU options", None),
    "srun_gpn4_accel_bind_g": ("srun --gpus-per-node=4 --accel-bind=g", ["--gpus-per-node=4", "--accel-bind=g"]),
    "srun_gpn4_bind_closest": ("srun --gpus-per-node=4 --gpu-bind=closest",
                               ["--gpus-per-node=4", "--gpu-bind=closest"]),
    # lists whose entries overlap: both local tasks see GPUs 0 and 1, or 0,1 and 1,2
    "srun_gpn4_bind_mask_same": ("srun --gpus-per-node=4 --gpu-bind=mask_gpu:0x3,0x3",
                                 ["--gpus-per-node=4", "--gpu-bind=mask_gpu:0x3,0x3"]),
    "srun_gpn4_bind_mask_overlap": ("srun --gpus-per-node=4 --gpu-bind=mask_gpu:0x3,0x6",
                                    ["--gpus-per-node=4", "--gpu-bind=mask_gpu:0x3,0x6"]),
}
# Where the tasks' views overlap, the right answer is given as the physical GPU of each local task.
PHYSICAL = {"srun_gpn4_bind_mask_same": ["0", "1"], "srun_gpn4_bind_mask_overlap": ["0", "1"]}


def gpu_case(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    cluster.require_gpus_per_node(4)
    opts = GPU_CASES[name][1]
    if opts is None:
        job = cluster.sbatch(f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2 --gpus-per-task=1\n"
                             f"srun python {GPU_PROBE}\n", "--nodelist=node1,node2")
        assert cluster.wait(job, timeout_s=60) == "COMPLETED", cluster.output(job)
        return records(cluster.job_dir, job)
    result = cluster.run(["srun", "-N2", "--ntasks-per-node=2", "--nodelist=node1,node2",
                          f"--chdir={cluster.job_dir}", *opts,
                          cluster.python, str(GPU_PROBE)], timeout_s=60)
    assert result.returncode == 0, result.stderr
    return records(cluster.job_dir)


def truth(name: str, r: dict[str, Any]) -> int:
    """Slurm's meaning: a task that sees one device owns it (index 0 of its view); a task that sees
    all of the node's GPUs takes the local_rank-th; with overlapping views, PHYSICAL says."""
    if name in PHYSICAL:
        return r["environ"]["CUDA_VISIBLE_DEVICES"].split(",").index(PHYSICAL[name][r["local_rank"]])
    return 0 if r["cuda_device_count"] == 1 else int(r["local_rank"])


@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_gpu_binding_each_rank_uses_its_own_gpu(cluster: Cluster, name: str) -> None:
    found = gpu_case(cluster, name)
    assert [r["rank"] for r in found] == [0, 1, 2, 3]
    physical = defaultdict(set)
    for r in found:
        assert (r["kind"], r["index"]) == ("cuda", truth(name, r)), r
        visible = r["environ"]["CUDA_VISIBLE_DEVICES"].split(",")
        physical[r["host"]].add(visible[r["index"]])
    # Two ranks on one node never share a physical GPU.
    assert all(len(ids) == 2 for ids in physical.values()), physical
    path = FIXTURES / f"{name}.json"
    tasks = [{"cuda_device_count": r["cuda_device_count"],
              "environ": {k: v for k, v in sorted(r["environ"].items()) if k != "SLURM_SUBMIT_DIR"},
              "expect": {"index": truth(name, r), "kind": "cuda"}, "local_rank": r["local_rank"],
              "local_world_size": r["local_world_size"]} for r in found]
    if RECORD:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "request": GPU_CASES[name][0],
            "source": "recorded on the torchslurm sandbox (Slurm 22.05.8, task/none, 2 nodes x 2 tasks, "
                      "4 fake GPUs per node) by tests/cluster/test_runtime_e2e.py",
            "tasks": tasks}, indent=1, sort_keys=True) + "\n")
        return
    assert path.exists(), f"{path} missing. HINT: TORCHSLURM_RECORD_SLURM_ENV=1 pytest {__file__} -k gpu"
    recorded = json.loads(path.read_text())["tasks"]
    stable = [[(t["environ"].get(k), t["expect"]["index"]) for k in GPU_KEYS] for t in tasks]
    assert stable == [[(t["environ"].get(k), t["expect"]["index"]) for k in GPU_KEYS] for t in recorded]


TRAIN_SETTINGS = ("epochs=2", "keep_last=5", "seed=7")


@pytest.fixture(scope="module")
def trained(cluster_factory: Callable[[Path], Cluster], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Training]:
    """The digits example trained twice on 2 nodes x 2 ranks, both jobs submitted at once: one srun
    task per rank, and one torchrun per node (c10d rendezvous on a job-unique port)."""
    cluster = cluster_factory(tmp_path_factory.mktemp("training"))
    srun_dir, torchrun_dir = cluster.job_dir / "srun", cluster.job_dir / "torchrun"
    settings = " ".join(TRAIN_SETTINGS)
    jobs = {
        # torchrun sets OMP_NUM_THREADS=1 for its workers; the same here, or the CPU kernels sum
        # in another order and the runs differ in the last bits.
        "srun": cluster.sbatch(f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2\nexport OMP_NUM_THREADS=1\n"
                               f"srun python {TRAIN_PROBE} {settings} run_dir={srun_dir}\n"),
        "torchrun": cluster.sbatch(f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --cpus-per-task=2
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
srun torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=$head:$((7000 + SLURM_JOB_ID % 2000)) \\
  --rdzv-id=$SLURM_JOB_ID {TRAIN_PROBE} {settings} run_dir={torchrun_dir}
"""),
    }
    states = {mode: cluster.wait(job, timeout_s=300) for mode, job in jobs.items()}
    yield Training(cluster, jobs, states, {"srun": srun_dir, "torchrun": torchrun_dir})
    cluster.cancel_running()


class Training:
    def __init__(self, cluster: Cluster, jobs: dict[str, str], states: dict[str, str],
                 run_dirs: dict[str, Path]) -> None:
        self.cluster, self.jobs, self.states, self.run_dirs = cluster, jobs, states, run_dirs

    def records(self, mode: str) -> list[dict[str, Any]]:
        assert self.states[mode] == "COMPLETED", self.cluster.output(self.jobs[mode])[-4000:]
        found = records(self.cluster.job_dir, self.jobs[mode])
        assert [r["rank"] for r in found] == [0, 1, 2, 3], self.cluster.output(self.jobs[mode])[-4000:]
        return found


def final_metrics(found: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    return {(r["epochs_done"], r["global_step"], r["val_loss_sum"], r["val_correct"], r["val_count"],
             r["weights_sum"]) for r in found}


def test_training_2x2_srun_spans_nodes_every_rank_agrees_one_checkpoint_per_save(trained: Training) -> None:
    found = trained.records("srun")
    assert {r["launcher"] for r in found} == {"srun"}
    assert sorted((r["host"], r["local_rank"]) for r in found) == [
        (found[0]["host"], 0), (found[0]["host"], 1), (found[2]["host"], 0), (found[2]["host"], 1)]
    assert found[0]["host"] != found[2]["host"]
    metrics = final_metrics(found)
    assert len(metrics) == 1, metrics  # every rank holds the same weights and the same exact metrics
    (epochs, _step, _loss, correct, count, _w), = metrics
    assert epochs == 2 and count == found[0]["val_size"]  # exact: no sample padded twice or dropped
    assert correct / count > 0.5
    ckpts = trained.run_dirs["srun"] / "checkpoints"
    entries = sorted(p.name for p in ckpts.iterdir())
    assert len(entries) == 2 and all(e.startswith("step-") for e in entries), entries  # one per epoch


def test_training_torchrun_mode_ends_with_the_same_metrics_as_srun_mode(trained: Training) -> None:
    found = trained.records("torchrun")
    assert {r["launcher"] for r in found} == {"torchrun"}
    assert len({r["host"] for r in found}) == 2
    assert final_metrics(found) == final_metrics(trained.records("srun"))


def test_torchslurm_train_in_a_batch_script_without_srun_trains_on_all_nodes(cluster: Cluster) -> None:
    job = cluster.sbatch(f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2\n"
                         f"torchslurm train epochs=1 run_dir={cluster.job_dir / 'run'}\n")
    assert cluster.wait(job, timeout_s=300) == "COMPLETED", cluster.output(job)[-4000:]
    out = cluster.output(job)
    assert re.search(r"Starting distributed training on 4 processes \(2 nodes × 2, gloo, cpu\), master node\d+:\d+",
                     out), out[-4000:]
    assert re.search(r"Epoch 1 - Avg Loss: \d+\.\d{6}, Accuracy: \d+\.\d\d%", out), out[-4000:]
    assert len(list((cluster.job_dir / "run" / "checkpoints").iterdir())) == 1


def test_readme_flow_mnist_example_under_torchslurm_run_trains_on_four_nodes(cluster: Cluster) -> None:
    """The README's sandbox section: an sbatch script whose only line is `torchslurm run examples/mnist.py`."""
    cluster.require_nodes(4)
    example = Path(__file__).parents[2] / "examples" / "mnist.py"
    job = cluster.sbatch(f"#!/bin/bash\n#SBATCH --nodes=4 --ntasks-per-node=1\n"
                         f"torchslurm run {example} dataset=digits epochs=1 run_dir={cluster.job_dir / 'run'}\n")
    assert cluster.wait(job, timeout_s=300) == "COMPLETED", cluster.output(job)[-4000:]
    out = cluster.output(job)
    assert re.search(r"Starting distributed training on 4 processes \(4 nodes × 1, gloo, cpu\)", out), out[-4000:]
    assert re.search(r"Epoch 1 - Avg Loss: \d+\.\d{6}, Accuracy: \d+\.\d\d%", out), out[-4000:]
    assert len(list((cluster.job_dir / "run" / "checkpoints").iterdir())) == 1
