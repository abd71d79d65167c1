"""A node-level failure keeps its node out of the requeued job, on the sandbox made a 3-node cluster
(--exclude=node4): a 2-node job whose rank on the second node fails with CUDA's uncorrectable-ECC
error is requeued with that node excluded and finishes on the other two."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.cluster.test_preemption import drive

from torchslurm import hostlist

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.cluster

SCRIPT = Path(__file__).parent / "jobs" / "badnode_train.py"


def test_a_node_with_an_ecc_error_is_excluded_from_the_requeued_job(cluster: Cluster) -> None:
    cluster.require_nodes(4)
    run_dir = cluster.job_dir / "run"
    run_dir.mkdir()
    job = cluster.sbatch(
        "#!/bin/bash\nexport OMP_NUM_THREADS=1 TORCH_CPP_LOG_LEVEL=ERROR\n"
        f"srun --kill-on-bad-exit=1 {cluster.python} {SCRIPT} {run_dir}\n",
        "--nodes=2", "--ntasks-per-node=1", "--exclude=node4", "--requeue", "--open-mode=append", "--job-name=badnode")
    state, restarts = drive(cluster, job, timeout_s=120)
    output = cluster.output(job)
    assert (state, restarts) == ("COMPLETED", 1), output[-4000:]
    bad = (run_dir / "attempt0-rank1.host").read_text()
    first = {(run_dir / "attempt0-rank0.host").read_text(), bad}
    final = {(run_dir / f"attempt1-rank{r}.host").read_text() for r in (0, 1)}
    assert final == {"node1", "node2", "node3"} - {bad}, (first, final)
    assert sorted(hostlist.expand(cluster.job(job)["ExcNodeList"])) == sorted(["node4", bad]), cluster.job(job)
    assert re.search(rf"excluded {bad} from the next attempt: rank 1 failed with an uncorrectable ECC error "
                     rf"\(job {job}, restart 1 of at most 3\)", output), output[-4000:]
    # the others name the root cause: rank 1's own error, not a collective that failed
    assert f"rank 1 on {bad} (" in output and "stopped with an error: RuntimeError: CUDA error: uncorrectable " \
           "ECC error encountered" in output, output[-4000:]
