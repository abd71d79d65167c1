"""`make gpu-check` cannot rot: its reduced form runs here on the CPU (one rank, as on one GPU: ddp the
one-process path, fsdp over a group of one; bf16 for fp16, the small GPT on 128 samples, tokens.py tiny),
every check must pass, and the JSON and the table it writes must say so. On a GPU the same script is run
by hand (docs/benchmarks.md).

But amp_resume: on the CPU it is amp=bf16 1 + 1 epochs against 2, the compile check's comparison
(`same_as_straight`) without compile, and fsdp_async_preempt resumes a bf16 run bitwise too; its three
start-ups are left out here to keep `make test` within its time (the GPU run has it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.multiproc


def test_the_gpu_check_passes_in_its_reduced_form_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "TORCHSLURM_"))}
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu", "--json", str(out),
               "--dir", str(tmp_path / "runs"), "--skip", "amp_resume"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(out.read_text())
    checks = found["checks"]
    assert list(checks) == ["doctor", "bench", "copy_stream", "tokens", "compile", "fsdp_async_preempt",
                            "cross_strategy"]
    assert all(check["ok"] for check in checks.values()), checks
    assert found["machine"]["ranks"] == 1 and found["machine"]["cuda"] is None
    assert checks["compile"]["ddp"]["bitwise"] and checks["compile"]["fsdp"]["off_then_on"]
    preempted = checks["fsdp_async_preempt"]
    assert preempted["bitwise"] and preempted["stopped_after_step"] > 8  # mid-epoch 2
    assert checks["tokens"]["tokens_per_s"]["Trainer"] > 0 and checks["tokens"]["ratio"] > 0
    assert "| compile | ok |" in done.stdout and "| cross_strategy | ok |" in done.stdout


@pytest.mark.parametrize("bad", [["--rounds", "0"], ["--warmup", "-1"], ["--steps", "0"], ["--warmup-steps", "0"],
                                 ["--epochs", "0"]])
def test_the_tokens_benchmark_refuses_counts_it_cannot_run_with_a_hint(bad: list[str]) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tokens.py"), "--cpu", *bad],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "expected --rounds >= 1, --warmup >= 0, --steps >= 1, --warmup-steps >= 1 and --epochs >= 1" in done.stderr
    assert "HINT: e.g. --rounds 2 --warmup 1 --warmup-steps 20 --steps 50" in done.stderr
