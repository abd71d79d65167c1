"""The GPU check: what must hold on a GPU, in one go (`make gpu-check`), under 8 minutes on one GPU.

Each check runs the real commands (`python -m torchslurm ...`, the Trainer through `torchslurm train`
on the built-in GPT and text corpus) and says ok or not with its numbers:

- doctor: `torchslurm doctor --json` on this machine (CUDA, NCCL and torch as doctor sees them);
- bench: `torchslurm bench` of all_reduce (NCCL on a GPU);
- amp_resume: amp=fp16 (bf16 on the CPU) for 1 epoch, resumed for a 2nd: the same weights and losses,
  bit for bit, as 2 epochs straight;
- cross_strategy: a ddp checkpoint (tensors.pt) resumed under fsdp, that one resumed under ddp again;
- fsdp_async_preempt: fsdp, amp=bf16, checkpoint_async=true, SIGUSR2 to the launcher mid-epoch: it stops
  with a checkpoint (exit 75) and the resumed run ends with the weights of an uninterrupted one, bitwise;
- compile: compile=true under ddp, 1 epoch + 1 resumed = 2 straight (bitwise, with deterministic=true);
  under fsdp a compile=false checkpoint resumed with compile=true; checkpoint keys as without compile;
- peak GPU memory per strategy (the epoch records' peak_gpu_memory_mib);
- copy_stream: a save beside validation copies its GPU tensors on a side stream, not waiting for the work
  queued after its snapshot (checkpoint.copying);
- tokens: benchmarks/tokens.py, the Trainer against a hand-written loop (GPT-2 small on a GPU).

Every run is --nproc ranks (default 1: one GPU): with one, ddp is the plain one-process path (the same
tensors.pt checkpoints) and fsdp shards over a process group of one; with 2 or more GPUs, --nproc 2 runs
real DDP and FSDP over NCCL. On a machine without a GPU (or --cpu) the same checks run on the CPU in a
reduced form (bf16 in place of fp16, 128 samples, tokens.py tiny and uncompiled); tests/docs runs that
in `make test`, so the script cannot rot. Writes a JSON (--json) and prints a short table.

    python benchmarks/gpu_check.py [--cpu] [--nproc N] [--json gpu-check.json] [--dir DIR] [--only/--skip a,b]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TORCHSLURM = [sys.executable, "-m", "torchslurm"]
PREEMPTED = 75


class Failed(Exception):
    """A check's own finding: what did not hold."""


class Machine:
    """Where the checks run: one GPU rank, or 2 CPU ranks."""

    def __init__(self, cpu: bool, root: Path, nproc: int) -> None:
        import torch

        self.gpu = torch.cuda.is_available() and not cpu
        self.root = root
        self.nproc = nproc
        self.fp16 = "fp16" if self.gpu else "bf16"
        self.env = {**os.environ, "TORCHSLURM_CHECK_PERIOD_S": "0", "PYTHONUNBUFFERED": "1",
                    **({} if self.gpu else {"TORCHSLURM_DEVICE": "cpu"})}
        self.facts = {"device": torch.cuda.get_device_name(0) if self.gpu else platform.processor() or "cpu",
                      "torch": torch.__version__, "cuda": torch.version.cuda if self.gpu else None,
                      "date": datetime.date.today().isoformat(), "ranks": self.nproc}

    def train_args(self, run_dir: Path, *settings: str) -> list[str]:
        """`torchslurm train` of the GPT on the text corpus into `run_dir`."""
        size = ("batch_size=64", "max_samples=2048") if self.gpu else ("batch_size=16", "max_samples=128")
        return [*TORCHSLURM, "train", "--nproc", str(self.nproc), "dataset=text", "model=gpt", *size, "lr=0.003",
                "log_every=5", "straggler_every=0", f"run_dir={run_dir}", *settings]

    def train(self, run_dir: Path, *settings: str, expect: int = 0, timeout_s: float = 300) -> str:
        """Run it; its output. Raises Failed unless it exits with `expect`."""
        done = subprocess.run(self.train_args(run_dir, *settings), capture_output=True, text=True, env=self.env,
                              timeout=timeout_s)
        output = done.stdout + done.stderr
        if done.returncode != expect:
            raise Failed(f"train {' '.join(settings)} exited {done.returncode}, expected {expect}:\n{output[-3000:]}")
        return output


def weights(run_dir: Path) -> dict[str, Any]:
    """The newest checkpoint's weights of `run_dir`, as one plain state_dict (however it was sharded)."""
    from torchslurm.train.checkpoint.weights import read_weights

    return read_weights(run_dir)[2]


def epochs(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "epoch"]


def losses(run_dir: Path) -> list[tuple[float, float]]:
    return [(r["train_loss"], r["val_loss"]) for r in epochs(run_dir)]


def differing(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The keys whose tensors are not bit for bit the same (or that only one side has)."""
    import torch

    return sorted(set(a) ^ set(b)) + [k for k in a if k in b and not torch.equal(a[k].cpu(), b[k].cpu())]


def largest_difference(a: dict[str, Any], b: dict[str, Any]) -> float:
    return max((float((a[k].cpu().double() - b[k].cpu().double()).abs().max()) for k in a if k in b), default=0.0)


def same_as_straight(machine: Machine, name: str, *settings: str) -> dict[str, Any]:
    """`settings` for 2 epochs straight, and for 1 epoch then resumed to 2: the same? On the CPU bit for
    bit; on a GPU some kernels add with atomics (embedding backward, say) in a varying order, so two equal
    runs differ in the last bits: there the losses must agree to 1e-3 and `bitwise` says whether they did
    exactly."""
    straight, split = machine.root / f"{name}-straight", machine.root / f"{name}-split"
    machine.train(straight, "epochs=2", *settings)
    machine.train(split, "epochs=1", *settings)
    resumed = machine.train(split, "epochs=2", *settings)
    if "Resuming from" not in resumed:
        raise Failed(f"the second run of {name} did not resume:\n{resumed[-2000:]}")
    a, b = weights(straight), weights(split)
    if sorted(a) != sorted(b):
        raise Failed(f"{name}: the resumed run's checkpoint holds other keys: {differing(a, b)[:5]}")
    bitwise = not differing(a, b) and losses(straight) == losses(split)
    close = all(abs(x - y) <= 1e-3 * max(1.0, abs(x)) for p, q in zip(losses(straight), losses(split), strict=True)
                for x, y in zip(p, q, strict=True))
    if not (bitwise or (machine.gpu and close)):
        raise Failed(f"{name}: resumed differs from 2 epochs straight: weights by up to "
                     f"{largest_difference(a, b):.3g}, "
                     f"losses {losses(straight)} vs {losses(split)}")
    return {"bitwise": bitwise, "max_weight_diff": largest_difference(a, b), "val_loss": losses(straight)[-1][1],
            "peak_gpu_memory_mib": _peak(straight)}


def _peak(run_dir: Path) -> float | None:
    return max((r.get("peak_gpu_memory_mib", 0.0) for r in epochs(run_dir)), default=None) or None


# ---- the checks ---------------------------------------------------------------------------------------
def check_doctor(machine: Machine) -> dict[str, Any]:
    done = subprocess.run([*TORCHSLURM, "doctor", "--json"], capture_output=True, text=True, env=machine.env,
                          timeout=120)
    if done.returncode != 0:
        raise Failed(f"doctor exited {done.returncode}:\n{(done.stdout + done.stderr)[-2000:]}")
    report = json.loads(done.stdout.splitlines()[-1])
    checks = {c["name"]: c for c in report["checks"]}
    if not report["ok"]:
        raise Failed("doctor: " + "; ".join(f"{c['name']}: {c['detail']}" for c in checks.values()
                                            if c["status"] not in ("ok", "info", "skip")))
    return {"torch": checks["torch"]["detail"], "gpus": checks["gpus"]["detail"]}


def check_bench(machine: Machine) -> dict[str, Any]:
    out = machine.root / "bench.json"
    sizes = "1M,64M,256M" if machine.gpu else "64K,1M"
    done = subprocess.run([*TORCHSLURM, "bench", "--nproc", str(machine.nproc), "--ops", "all_reduce", "--sizes",
                           sizes, "--iters", "10", "--warmup", "3", "--json", str(out)],
                          capture_output=True, text=True, env=machine.env, timeout=180)
    if done.returncode != 0:
        raise Failed(f"bench exited {done.returncode}:\n{(done.stdout + done.stderr)[-2000:]}")
    return {"backend": "nccl" if machine.gpu else "gloo", "result": json.loads(out.read_text())}


def check_copy_stream(machine: Machine) -> dict[str, Any]:
    """A save beside validation copies its GPU tensors off the training stream (checkpoint.copying): on a
    saving thread, the copy of a snapshot ends while ~1 s of work queued after it still runs, and equals
    the tensor. On the CPU there is no stream: the snapshot needs no event."""
    import threading

    import torch

    from torchslurm.train.checkpoint.copying import copying_after, device_ready

    if not machine.gpu:
        if device_ready({"w": torch.ones(3)}) is not None:
            raise Failed("a snapshot of CPU tensors got a CUDA event")
        return {"gpu": False}
    weights = {"w": torch.randn(1 << 22, device="cuda")}
    ready = device_ready(weights)
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(200):  # queued after the snapshot, as validation's kernels are
        x = torch.nn.functional.normalize(x @ x, dim=1)
    queued = torch.cuda.Event()
    queued.record()
    seen: dict[str, Any] = {}

    def save() -> None:  # the saving thread: its current device and stream are its own
        with copying_after(ready):
            seen["copy"] = weights["w"].cpu()
        seen["queue_still_running"] = not queued.query()

    thread = threading.Thread(target=save)
    thread.start()
    thread.join()
    if not seen["queue_still_running"]:
        raise Failed("the snapshot's copy waited for the work queued after it (it ran on the training stream)")
    if not torch.equal(seen["copy"], weights["w"].cpu()):
        raise Failed("the snapshot's copy differs from the tensor")
    return {"gpu": True, "queue_still_running": True}


def check_amp_resume(machine: Machine) -> dict[str, Any]:
    return {"amp": machine.fp16, **same_as_straight(machine, "amp", f"amp={machine.fp16}")}


def check_cross_strategy(machine: Machine) -> dict[str, Any]:
    run_dir, seen = machine.root / "cross", []
    for epoch, strategy in enumerate(("ddp", "fsdp", "ddp"), start=1):
        output = machine.train(run_dir, f"epochs={epoch}", f"strategy={strategy}")
        if epoch > 1 and "Resuming from" not in output:
            raise Failed(f"strategy={strategy} did not resume the checkpoint of the run before:\n{output[-2000:]}")
        state = weights(run_dir)
        seen.append(sorted(state))
        if not all(bool(t.float().isfinite().all()) for t in state.values()):
            raise Failed(f"strategy={strategy}: non-finite weights after resuming")
    if seen[0] != seen[1] or seen[1] != seen[2]:
        raise Failed("the checkpoint keys changed between strategies")
    val = [loss for _, loss in losses(run_dir)]
    if not (val[2] < val[0] and all(math.isfinite(v) for v in val)):
        raise Failed(f"validation loss did not go down across the resumes: {val}")
    return {"val_loss": val}


def check_fsdp_async_preempt(machine: Machine) -> dict[str, Any]:
    settings = ("epochs=2", "strategy=fsdp", "amp=bf16", "checkpoint_async=true", "log_every=1")
    straight, stopped = machine.root / "preempt-straight", machine.root / "preempt"
    machine.train(straight, *settings)
    step = _stop_mid_epoch(machine, stopped, settings, after_step=10)
    resumed = machine.train(stopped, *settings)
    if "Resuming from" not in resumed:
        raise Failed(f"the stopped run did not resume:\n{resumed[-2000:]}")
    a, b = weights(straight), weights(stopped)
    bitwise = not differing(a, b)
    if not bitwise and not machine.gpu:  # on a GPU atomics may differ in the last bits (see same_as_straight)
        raise Failed(f"resumed weights differ from the uninterrupted run's in {differing(a, b)[:5]}")
    return {"stopped_after_step": step, "bitwise": bitwise, "max_weight_diff": largest_difference(a, b),
            "val_loss": [losses(straight)[-1][1], losses(stopped)[-1][1]], "peak_gpu_memory_mib": _peak(straight)}


def _stop_mid_epoch(machine: Machine, run_dir: Path, settings: tuple[str, ...], after_step: int) -> int:
    """Start the run, send SIGUSR2 to the launcher once a progress line shows `after_step`; the step it
    stopped after (it must exit 75, preempted, with a checkpoint)."""
    proc = subprocess.Popen(machine.train_args(run_dir, *settings), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=machine.env)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if f" step {after_step}:" in line:
                proc.send_signal(signal.SIGUSR2)
                break
        lines.extend(proc.stdout)
        code = proc.wait(timeout=300)
    finally:
        proc.kill()
    output = "".join(lines)
    if code != PREEMPTED:
        raise Failed(f"after SIGUSR2 the run exited {code}, expected {PREEMPTED}:\n{output[-3000:]}")
    stops = [line for line in lines if "stopping early at epoch" in line]
    if not stops:
        raise Failed(f"no 'stopping early' line:\n{output[-3000:]}")
    return int(stops[-1].rsplit("step", 1)[1].split()[0])


def check_compile(machine: Machine) -> dict[str, Any]:
    """ddp: 1 + 1 resumed epochs against 2 straight, compile on; fsdp: a compile=false epoch resumed with
    compile=true (its units compiled, the same checkpoint keys)."""
    found: dict[str, Any] = {"ddp": same_as_straight(machine, "compile-ddp", "compile=true", "strategy=ddp",
                                                     "deterministic=true")}
    across = machine.root / "compile-fsdp"
    machine.train(across, "epochs=1", "compile=false", "strategy=fsdp")
    before = sorted(weights(across))
    if "Resuming from" not in machine.train(across, "epochs=2", "compile=true", "strategy=fsdp"):
        raise Failed("a compile=false checkpoint was not resumed with compile=true under fsdp")
    for name, run_dir in (("ddp", machine.root / "compile-ddp-straight"), ("fsdp", across)):
        keys = sorted(weights(run_dir))
        if keys != before or any("_orig_mod" in k for k in keys):
            raise Failed(f"compile=true under {name}: checkpoint keys {keys[:3]}..., expected {before[:3]}...")
        found.setdefault(name, {})["compile_s"] = sum(r.get("compile_s", 0.0) for r in epochs(run_dir))
    found["fsdp"]["off_then_on"] = True
    found["fsdp"]["val_loss"] = losses(across)[-1][1]
    return found


def check_tokens(machine: Machine) -> dict[str, Any]:
    out = machine.root / "tokens.json"
    size = [] if machine.gpu else ["--cpu", "--size", "tiny", "--no-compile"]
    rounds = ["--rounds", "2", "--warmup", "1", "--warmup-steps", "10", "--steps", "50"] if machine.gpu else \
        ["--rounds", "1", "--warmup", "0", "--steps", "2"]
    args = [*size, *rounds]
    done = subprocess.run([sys.executable, str(HERE / "tokens.py"), *args, "--json", str(out)], capture_output=True,
                          text=True, env=machine.env, timeout=420)
    if done.returncode != 0:
        raise Failed(f"tokens.py exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    return dict(json.loads(out.read_text()))


CHECKS: dict[str, Callable[[Machine], dict[str, Any]]] = {  # the most telling first: a run cut short keeps them
    "doctor": check_doctor, "bench": check_bench, "copy_stream": check_copy_stream, "tokens": check_tokens,
    "compile": check_compile,
    "amp_resume": check_amp_resume, "fsdp_async_preempt": check_fsdp_async_preempt,
    "cross_strategy": check_cross_strategy,
}


def run_checks(machine: Machine, names: list[str], out: Path) -> dict[str, Any]:
    """Each check in turn; `out` is rewritten after each (a run cut short still leaves what it found)."""
    results: dict[str, Any] = {}
    for name in names:
        started = time.perf_counter()
        try:
            results[name] = {"ok": True, **CHECKS[name](machine)}
        except (Failed, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as exc:
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        results[name]["seconds"] = round(time.perf_counter() - started, 1)
        print(f"{name}: {'ok' if results[name]['ok'] else 'FAILED'} ({results[name]['seconds']} s)", flush=True)
        out.write_text(json.dumps({"machine": machine.facts, "checks": results}, indent=2) + "\n")
    return results


def table(facts: dict[str, Any], results: dict[str, Any]) -> str:
    lines = [f"GPU check on {facts['device']}, torch {facts['torch']}, CUDA {facts['cuda']}, {facts['ranks']} "
             f"rank(s), {facts['date']}", "", "| check | result | seconds | figures |", "| --- | --- | --- | --- |"]
    for name, found in results.items():
        figures = {k: v for k, v in found.items() if k not in ("ok", "seconds", "error", "result")}
        shown = found.get("error", "").splitlines()[0][:120] if not found["ok"] else json.dumps(figures)[:160]
        lines.append(f"| {name} | {'ok' if found['ok'] else 'FAILED'} | {found['seconds']} | {shown} |")
    return "\n".join(lines)


@contextmanager
def work_dir(given: str | None) -> Iterator[Path]:
    if given:
        Path(given).mkdir(parents=True, exist_ok=True)
        yield Path(given)
    else:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the reduced form on the CPU even with a GPU")
    parser.add_argument("--nproc", type=int, default=1, help="ranks of every run (at most one per GPU)")
    parser.add_argument("--json", default="gpu-check.json", help="where the results go")
    parser.add_argument("--dir", help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--only", default="", help="comma-separated checks to run (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated checks to leave out")
    args = parser.parse_args(argv)
    names = [n for n in (args.only.split(",") if args.only else CHECKS) if n and n not in args.skip.split(",")]
    if unknown := [n for n in names if n not in CHECKS]:
        parser.error(f"unknown check(s) {', '.join(unknown)}; the checks are {', '.join(CHECKS)}")
    with work_dir(args.dir) as root:
        machine = Machine(args.cpu, root, args.nproc)
        results = run_checks(machine, names, Path(args.json))
    print(table(machine.facts, results))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
