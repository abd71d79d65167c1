"""strategy=fsdp on the sandbox: 2 nodes x 2 ranks, srun mode, jobs from torchslurm's own sbatch
renderer (preemptible: --signal=USR2@grace, --requeue).

An FSDP job signalled mid-epoch stops at a step boundary, writes its sharded checkpoint (in the
background, waited for), requeues itself and resumes to bitwise the same weights as an
uninterrupted FSDP job; and examples/gpt.py trains under `torchslurm submit`.

This file is also the jobs' rank program: `python test_fsdp.py run_dir=DIR [step_sleep=S]` trains a
tiny GPT with the Trainer's own preemption and watchdog, and exits with FitResult.exit_code. The
sleep is for the test to signal the first run; a requeued run (SLURM_RESTART_COUNT > 0) goes at full speed.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.cluster

EXAMPLE = Path(__file__).parents[2] / "examples" / "gpt.py"
STEPS_PER_EPOCH = 15  # 461 training windows of 16 bytes, 4 ranks x batch 8
EPOCHS = 2


# ---- the rank program ---------------------------------------------------------------------------
def rank_main(args: dict[str, str]) -> int:
    import logging
    import socket

    import torch

    import torchslurm
    from torchslurm.train import tasks
    from torchslurm.train.models import GPT
    from torchslurm.train.text import stdlib_text
    from torchslurm.train.trainer import TrainConfig, Trainer, seed_everything

    sleep_s = float(args.get("step_sleep", 0)) if int(os.environ.get("SLURM_RESTART_COUNT") or 0) == 0 else 0.0

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if sleep_s and torch.is_grad_enabled():  # training steps only: gives the test time to signal
            time.sleep(sleep_s)
        return tasks.token_cross_entropy(logits, targets)

    cfg = TrainConfig(epochs=EPOCHS, batch_size=8, lr=0.003, run_dir=Path(args["run_dir"]), log_every=1,
                      strategy="fsdp", fsdp_wrap="Block", grad_clip=1.0, checkpoint_async=True,
                      checkpoint_every_steps=4, checkpoint_every_epochs=0)
    with torchslurm.init(timeout_s=60) as ctx:
        logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                            format=f"%(asctime)s [rank {ctx.rank} {socket.gethostname()}] %(name)s %(message)s")
        seed_everything(0)
        model = GPT(block_size=16, dim=32, layers=2, heads=2)
        train, val = stdlib_text(block_size=16, max_bytes=8 << 10)
        result = Trainer(model, torch.optim.AdamW(model.parameters(), lr=cfg.lr), loss, train, val, cfg, ctx=ctx,
                         task=tasks.language_model(model.flops_per_token())).fit()
        if result.stopped_early:
            print(f"rank {ctx.rank}: stopped at step {result.global_step}\n", end="", flush=True)
        return result.exit_code


# ---- the tests ----------------------------------------------------------------------------------
def _job(cluster: Cluster, run_dir: Path, *args: str) -> str:
    from torchslurm.jobs.sbatch import render
    from torchslurm.jobs.spec import JobSpec

    spec = JobSpec(script=__file__, args=(f"run_dir={run_dir}", *args), name="fsdp", nodes=2, tasks_per_node=2,
                   time="5", preemptible=True, grace_s=60, python=cluster.python,
                   # one thread per rank: the CPU kernels sum in the same order in both jobs
                   env={"OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"})
    return cluster.sbatch(render(spec))


def _final_model(run_dir: Path) -> tuple[int, dict[str, Any]]:
    from torchslurm.train import checkpoint

    step, folder = checkpoint.complete(run_dir / "checkpoints")[-1]
    return step, checkpoint.read_model(folder)


def _records(run_dir: Path, kind: str = "step") -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [record for record in map(json.loads, lines) if record["kind"] == kind]


def test_fsdp_job_signalled_mid_epoch_requeues_and_resumes_bitwise(cluster: Cluster) -> None:
    import torch
    from tests.cluster.test_preemption import stopped_once_and_requeued, wait_for

    reference_dir, run_dir = cluster.job_dir / "reference", cluster.job_dir / "run"
    reference = _job(cluster, reference_dir)
    job = _job(cluster, run_dir, "step_sleep=0.3")
    wait_for(lambda: len(_records(run_dir)) >= 2, 120, f"job {job} logged no steps: {cluster.job(job)}")
    assert cluster.run(["scancel", "--signal=USR2", job]).returncode == 0
    output, step = stopped_once_and_requeued(cluster, job)
    assert 0 < step < EPOCHS * STEPS_PER_EPOCH, output[-4000:]
    # the stop's background save was waited for: the requeued job resumes at the very step it stopped
    resumed = re.search(rf"Resuming from \S+step-{step:09d}: epoch \d, batch (\d+), step {step}\b", output)
    assert resumed, output[-4000:]
    assert cluster.wait(reference, timeout_s=120) == "COMPLETED", cluster.output(reference)[-4000:]
    (mine_step, mine), (their_step, theirs) = _final_model(run_dir), _final_model(reference_dir)
    assert mine_step == their_step == EPOCHS * STEPS_PER_EPOCH
    assert mine.keys() == theirs.keys() and mine
    different = [k for k in mine if not torch.equal(mine[k], theirs[k])]
    assert not different, f"weights differ from the uninterrupted FSDP run in {different}"


def test_gpt_example_trains_under_torchslurm_submit(cluster: Cluster) -> None:
    """examples/gpt.py as it ships (FSDP, background checkpoints) on 2 nodes x 2 ranks."""
    result = cluster.run([cluster.python, "-m", "torchslurm", "submit", "--name", "gpt", "--nodes", "2",
                          "--tasks-per-node", "2", "--python", cluster.python, "--time", "5",
                          "--env", "TORCH_CPP_LOG_LEVEL=ERROR", "--run-dir", str(cluster.job_dir), str(EXAMPLE)],
                         cwd=cluster.job_dir)
    assert result.returncode == 0, result.stderr
    job = re.search(r"submitted job (\d+)", result.stdout).group(1)  # type: ignore[union-attr]
    cluster.job_ids.append(job)
    assert cluster.wait(job, timeout_s=150) == "COMPLETED", cluster.output(job)[-4000:]
    output = cluster.output(job)
    assert re.search(r"validation loss [\d.]+ per token", output), output[-4000:]
    run_dir = cluster.job_dir / "runs" / "gpt-example"
    losses = [r["loss"] for r in _records(run_dir)]
    assert len(losses) >= 2 and losses[-1] < losses[0], losses
    step, model = _final_model(run_dir)  # the checkpoint after the last epoch, readable whole
    assert step == _records(run_dir, "epoch")[-1]["step"]
    assert "head.weight" in model


if __name__ == "__main__":
    sys.exit(rank_main(dict(a.split("=", 1) for a in sys.argv[1:])))
