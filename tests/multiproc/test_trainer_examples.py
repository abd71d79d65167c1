"""The examples run as the docs say: plain python (one process), under torchrun, under torchslurm run."""

from __future__ import annotations

import importlib.util
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.multiproc.conftest import clean_environ

import torchslurm
from torchslurm.cli import main
from torchslurm.train import checkpoint, data

pytestmark = pytest.mark.multiproc
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"




def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=300, env=clean_environ(), cwd=cwd)


def test_mnist_example_on_one_process_reads_idx_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 96), ("t10k", 40)):  # a tiny MNIST in the real file format, gzipped
        data.write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28), np.uint8))
        data.write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", (np.arange(n) % 10).astype(np.uint8))
    result = _run(sys.executable, str(EXAMPLES / "mnist.py"), "--data-dir", str(tmp_path), "--epochs", "1",
                  "--batch-size", "32", "log_every=1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Starting distributed training on 1 process (1 node × 1, gloo, cpu)" in result.stdout + result.stderr
    assert "outputs in runs/mnist" in result.stdout
    assert (tmp_path / "runs" / "mnist" / "checkpoints" / "step-000000003" / "COMPLETE").is_file()


def test_mnist_example_without_files_names_them(tmp_path: Path) -> None:
    result = _run(sys.executable, str(EXAMPLES / "mnist.py"), "--data-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert f"error: data_dir={tmp_path}: MNIST files missing: train-images-idx3-ubyte[.gz]" in result.stderr


def test_simple_model_under_plain_torchrun(tmp_path: Path) -> None:
    result = _run(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                  str(EXAMPLES / "simple_model.py"), "--epochs", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert "Starting distributed training on 2 processes (1 node × 2, gloo, cpu)" in out
    accuracy = float(out.split("final validation accuracy ")[1].split("%")[0])
    assert accuracy > 80.0  # 10→50→2 learns the synthetic rule quickly


def docs_python_block(page: str, after: str) -> str:
    text = (EXAMPLES.parent / "docs" / page).read_text()
    start = text.index("```python\n", text.index(after)) + len("```python\n")
    return text[start:text.index("```", start)]


def test_the_docs_own_model_script_trains_on_two_ranks(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(docs_python_block("training.md", "## Your own model"))
    result = _run(sys.executable, "-m", "torchslurm", "run", "--nproc", "2", "mine.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = re.search(r"validation accuracy (\d+\.\d\d)%", result.stdout)
    assert accuracy and float(accuracy.group(1)) > 80.0, result.stdout[-3000:]
    assert checkpoint.complete(tmp_path / "runs" / "mine" / "checkpoints")


def test_an_example_stops_on_the_preemption_signal_and_the_same_command_resumes(tmp_path: Path) -> None:
    """No preemption code in the example: the Trainer's own handles Slurm's warning signal."""
    command = [sys.executable, "-m", "torchslurm", "run", "--nproc", "2", str(EXAMPLES / "simple_model.py"),
               "--epochs", "3", "--batch-size", "8", "log_every=1", f"run_dir={tmp_path / 'run'}"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_environ(),
                            cwd=tmp_path)
    metrics, deadline = tmp_path / "run" / "metrics.jsonl", time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and '"kind": "step"' in metrics.read_text():
            proc.send_signal(signal.SIGUSR2)  # what Slurm's --signal=USR2@grace sends
            break
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, out[-3000:]
    assert "stopping at this step boundary: SIGUSR2" in out and "final validation accuracy" not in out, out[-3000:]
    resumed = _run(*command, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from" in resumed.stdout + resumed.stderr and "final validation accuracy" in resumed.stdout


def _example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _two_ranks(argv: list[str], port: int, cwd: Path) -> list[tuple[int, str, str]]:
    """`argv` as 2 ranks started the way srun starts them (no agent: one torch import less per run);
    each rank's (exit code, stdout, stderr)."""
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                              env=clean_environ(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                                                LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                                OMP_NUM_THREADS="1"))
             for rank in range(2)]
    try:
        outputs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]


def test_own_model_trains_under_ddp_and_fsdp_and_its_weights_come_back_out(tmp_path: Path,
                                                                           free_port: Callable[[], int]) -> None:
    """The Hugging-Face-style example (dict batches, its own step and collate) for a few steps on 2 ranks
    with each strategy; then the DDP checkpoint (tensors.pt) and the FSDP one (shards written by both
    ranks) load into a plain model in this one process, and `torchslurm export` writes the same weights."""
    runs = {}
    for strategy in ("ddp", "fsdp"):
        runs[strategy] = tmp_path / strategy
        ranks = _two_ranks([sys.executable, str(EXAMPLES / "own_model.py"), "--text-bytes", "3000", "epochs=1",
                            "batch_size=8", "log_every=0", f"strategy={strategy}", f"run_dir={runs[strategy]}"],
                           free_port(), tmp_path)
        assert [code for code, _, _ in ranks] == [0, 0], [err[-3000:] for _, _, err in ranks]
        assert "validation loss" in ranks[0][1] and "Perplexity" in ranks[0][2], ranks[0][1][-2000:]
    (_, ddp_step), (_, fsdp_step) = (checkpoint.complete(runs[s] / "checkpoints")[-1] for s in ("ddp", "fsdp"))
    assert (ddp_step / "tensors.pt").is_file() and sorted(p.name for p in (fsdp_step / "shards").iterdir()) == [
        "tensors-00000.pt", "tensors-00001.pt"]
    example = _example("own_model")
    models = {strategy: example.TinyCausalLM() for strategy in runs}
    for strategy, model in models.items():
        loaded = torchslurm.load_model(model, runs[strategy])
        assert loaded.folder == {"ddp": ddp_step, "fsdp": fsdp_step}[strategy] and loaded.step > 0
    ddp_weights, fsdp_weights = models["ddp"].state_dict(), models["fsdp"].state_dict()
    assert all(torch.allclose(ddp_weights[k], fsdp_weights[k], atol=1e-5) for k in ddp_weights)  # one training
    assert main(["export", str(runs["fsdp"]), str(tmp_path / "model.pt")]) == 0
    exported = torch.load(tmp_path / "model.pt", weights_only=True)
    assert exported.keys() == fsdp_weights.keys() and all(torch.equal(exported[k], fsdp_weights[k]) for k in exported)


def test_a_shape_bug_in_the_loss_on_every_rank_is_reported_as_the_users_error(tmp_path: Path,
                                                                            free_port: Callable[[], int]) -> None:
    """Not as "a collective failed while every rank still has a heartbeat" with a hint about networks."""
    script = Path(__file__).parent / "scripts" / "user_bug.py"
    line = next(n for n, text in enumerate(script.read_text().splitlines(), 1) if "# the bug" in text)
    ranks = _two_ranks([sys.executable, str(script), str(tmp_path / "run")], free_port(), tmp_path)
    for rank, (code, _, error) in enumerate(ranks):
        assert f"UserCodeError: rank {rank}: loss_fn raised RuntimeError at {script}:{line} (in loss_fn): The size " \
               "of tensor a (8) must match the size of tensor b (3)" in error, error[-3000:]
        assert "not a distributed failure" in error
        assert "DistributedError" not in error and "collective failed" not in error, error[-3000:]
        assert code == 1


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed")
def test_imagefolder_example_explains_missing_torchvision(tmp_path: Path) -> None:
    result = _run(sys.executable, str(EXAMPLES / "imagefolder.py"), "--data-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert "needs torchvision, which is not installed. HINT: pip install torchvision" in result.stderr
