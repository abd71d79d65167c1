"""`torchslurm stacks JOB` on a running sandbox job: a user's own loop under torchslurm.init(), two
nodes; found through the job's folder in the home folder (HOME points into the test's job_dir), and the
job goes on and finishes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from torchslurm.runtime.stackwatch import job_dir, registered

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.cluster

LOOP = Path(__file__).parent / "jobs" / "stacks_loop.py"


def test_stacks_of_a_running_job_without_stopping_it(cluster: Cluster) -> None:
    home = cluster.job_dir / "home"
    job = cluster.sbatch(f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1\nexport OMP_NUM_THREADS=1\n"
                         f"srun {cluster.python} {LOOP}\n", f"--export=ALL,HOME={home}")
    folder = job_dir(job, home)
    deadline = time.monotonic() + 120
    while len(registered(folder)) < 2:  # both ranks passed torchslurm.init()
        assert time.monotonic() < deadline and cluster.job(job).get("JobState") in ("PENDING", "RUNNING"), \
            cluster.output(job)[-3000:]
        time.sleep(0.2)
    stacks = subprocess.run([sys.executable, "-m", "torchslurm", "stacks", job], capture_output=True, text=True,
                            timeout=60, env={**cluster.environ, "HOME": str(home)})
    (cluster.job_dir / "stop").write_text("")
    print(f"$ torchslurm stacks {job}\n{stacks.stdout}")  # shown with -s
    assert cluster.wait(job) == "COMPLETED", cluster.output(job)[-3000:]
    assert stacks.returncode == 0, stacks.stdout + stacks.stderr
    assert f"job {job}: 2 of 2 rank(s) answered in " in stacks.stdout
    assert "ranks 0-1: " in stacks.stdout or ("rank 0: " in stacks.stdout and "rank 1: " in stacks.stdout)
    assert " at stacks_loop.py:" in stacks.stdout and "[node" in stacks.stdout, stacks.stdout
    out = cluster.output(job)
    assert "rank 0: " in out and "rank 1: " in out
    assert registered(folder) == {}  # each rank removed its file at shutdown
