"""amp=fp16 under strategy=fsdp, checked where it runs: one JSON line, {"check": "fsdp_fp16", "ok": ...}.

    python benchmarks/_gpu/fp16_fsdp.py            # CUDA: the real amp=fp16 (under a minute on one GPU)
    python benchmarks/_gpu/fp16_fsdp.py --cpu      # the reduced form on 2 Gloo ranks (no GPU needed)

It starts its ranks itself (`torchslurm run --nproc N` on this file; N = 2, or the GPUs seen when fewer),
and every rank does two things:

1. **the sharded scaler**: the GPT sharded by `fsdp.shard_model(amp="fp16")` (fp16 parameters in
   forward and backward, fp32 gradient shards as DTensors), `torch.autocast(float16)`, the Trainer's
   GradScaler. Step 1 puts an inf into the last rank's gradient shard only: every rank must skip the
   step and halve the scale alike, and the clipped norm must be inf. Step 2 is normal: every rank
   steps, and the global norm that `fsdp.clip_grad_norm` computes from the shards equals the norm of
   the gathered whole gradients.
2. **the Trainer's resume**: dataset=text's GPT with strategy=fsdp and grad_clip=1.0, 1 epoch then a
   resume for a 2nd, against 2 epochs straight: step losses, validation losses, the gathered model and
   optimizer state and the scaler's state (scale and growth tracker) must be equal bitwise.

On CUDA the Trainer runs amp=fp16 itself, at the size `torchslurm train dataset=text` uses. One rank
(one GPU) trains unsharded in the Trainer (it shards only across ranks), so with one GPU part 1 is
the FSDP2 + fp16 proof on CUDA and part 2 the fp16 resume; with 2 GPUs both are sharded. `--cpu`:
amp=fp16 needs CUDA (the Trainer refuses it on a CPU, where fp16 matrix products are slow), so the
Trainer trains in fp32 with the same fp16 GradScaler put in its place, on a smaller GPT and corpus;
part 1 runs fp16 autocast on the CPU, which torch allows.
The ranks turn on torch's deterministic algorithms (warn only), so that a kernel that adds in a
varying order cannot make two equal runs differ: the check is of the resume, not of the kernels.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

CHECK = "fsdp_fp16"


# ---- each rank ----------------------------------------------------------------------------------
def sharded_scaler(ctx: Any, cpu: bool) -> dict[str, Any]:
    """Part 1: two hand-written steps of a sharded fp16 GPT; what every rank saw."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from torchslurm.train import fsdp, tasks
    from torchslurm.train.models import GPT
    from torchslurm.train.rng import seed_everything
    from torchslurm.train.strategy import make_scaler

    seed_everything(0)
    size = {"block_size": 16, "dim": 32, "layers": 2, "heads": 2} if cpu else {}
    model = fsdp.shard_model(GPT(**size).to(ctx.device), wrap=("Block",), amp="fp16")
    optimizer, scaler = torch.optim.AdamW(model.parameters(), lr=1e-3), make_scaler("fp16", ctx.device.type)
    params = list(model.parameters())
    block = model.block_size
    tokens = torch.randint(0, 256, (8, block + 1), generator=torch.Generator().manual_seed(ctx.rank)).to(ctx.device)
    steps = []
    for poisoned in (True, False):
        with torch.autocast(ctx.device.type, dtype=torch.float16):
            logits = model(tokens[:, :-1])
        scaler.scale(tasks.token_cross_entropy(logits, tokens[:, 1:])).backward()
        if poisoned and ctx.rank == ctx.world_size - 1:  # this rank's shard only: the others' are finite
            shard = next(p.grad.to_local() for p in params if p.grad.to_local().numel())
            shard.view(-1)[0] = float("inf")
        before = [p.detach().to_local().clone() for p in params]
        scaler.unscale_(optimizer)
        whole = math.sqrt(sum(float(p.grad.full_tensor().double().pow(2).sum()) for p in params))
        norm = fsdp.clip_grad_norm(params, 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        steps.append({"stepped": any(not torch.equal(b, p.detach().to_local()) for b, p in zip(before, params,
                                                                                              strict=True)),
                      "scale": scaler.get_scale(), "norm": norm,
                      "norm_matches_whole": math.isfinite(norm) and abs(norm - whole) <= 1e-6 * whole})
    kinds = sorted({f"{type(p.grad).__name__ if p.grad is not None else 'None'} {p.dtype}" for p in params})
    mine = {"logits": str(logits.dtype), "parameters": kinds, "steps": steps,
            "sharded": all(isinstance(p, DTensor) for p in params)}
    every: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(every, mine)
    init = make_scaler("fp16", ctx.device.type).get_scale()
    first, second = zip(*(rank["steps"] for rank in every), strict=True)
    return {
        "ok": all(not s["stepped"] and s["scale"] == init / 2 and not math.isfinite(s["norm"]) for s in first)
        and all(s["stepped"] and s["scale"] == init / 2 and s["norm_matches_whole"] for s in second)
        and len({s["norm"] for s in second}) == 1 and all(r["logits"] == "torch.float16" for r in every)
        and all(r["sharded"] for r in every),
        "ranks": every,
    }


def _trainer(ctx: Any, run_dir: Path, epochs: int, cpu: bool) -> Any:
    """dataset=text's GPT under the Trainer with strategy=fsdp and fp16's GradScaler."""
    import torch

    from torchslurm.train import data, models, tasks
    from torchslurm.train.models import GPT
    from torchslurm.train.rng import seed_everything
    from torchslurm.train.strategy import make_scaler
    from torchslurm.train.text import stdlib_text
    from torchslurm.train.trainer import TrainConfig, Trainer

    cfg = TrainConfig(epochs=epochs, batch_size=16 if cpu else 32, lr=0.003, run_dir=run_dir, log_every=1,
                      strategy="fsdp", amp="off" if cpu else "fp16", grad_clip=1.0, checkpoint_every_epochs=1)
    seed_everything(0)
    if cpu:
        train, val = stdlib_text(block_size=16, max_bytes=8 << 10)
        model = GPT(block_size=16, dim=32, layers=2, heads=2)
    else:  # what `torchslurm train dataset=text` trains
        train, val = data.load("text", None, 0.2, seed=0)
        model = cast(GPT, models.build("gpt", *data.describe(train)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    trainer = Trainer(model, optimizer, tasks.token_cross_entropy, train, val, cfg, ctx=ctx,
                      task=tasks.language_model(model.flops_per_token()))
    if cpu:  # amp=fp16 needs CUDA: the same scaler, fp32 compute
        trainer.scaler = make_scaler("fp16", "cpu")
    return trainer


def _gathered(trainer: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model, optim = get_state_dict(trainer.model, trainer.optimizer,
                                  options=StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True))
    return {**{f"model.{k}": v for k, v in model.items()}, **{f"optim.{k}": v for k, v in optim.items()}}


def _records(run_dir: Path) -> list[tuple[Any, ...]]:
    """(epoch, step, loss) of each step and (epoch, train loss, validation loss) of each epoch."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["epoch"], r["step"], r["loss"]) if r["kind"] == "step" else (r["epoch"], r["train_loss"], r["val_loss"])
            for r in rows if r["kind"] in ("step", "epoch")]


def resume(ctx: Any, out: Path, cpu: bool) -> dict[str, Any]:
    """Part 2: 1 epoch, then a resume for the 2nd, against 2 epochs straight."""
    import torch
    import torch.distributed as dist

    straight = _trainer(ctx, out / "straight", 2, cpu)
    straight.fit()
    _trainer(ctx, out / "split", 1, cpu).fit()
    resumed = _trainer(ctx, out / "split", 2, cpu)
    resumed.fit()
    a, b = _gathered(straight), _gathered(resumed)
    diffs = [float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0
             for k in a if isinstance(a[k], torch.Tensor) and k in b]
    mine = {"state_equal": a.keys() == b.keys() and all(
                torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a),
            "max_state_diff": max(diffs, default=0.0),
            "scaler": resumed.scaler.state_dict(), "scaler_equal": straight.scaler.state_dict() ==
            resumed.scaler.state_dict(), "trainer_sharded": straight.strategy.state_form == "sharded"}
    every: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(every, mine)
    found: dict[str, Any] = {"ranks": every}
    if ctx.is_main:
        lines, split = _records(out / "straight"), _records(out / "split")
        found["losses_equal"] = lines == split
        found["losses"] = len(lines)
        found["max_loss_diff"] = max((abs(x[-1] - y[-1]) for x, y in zip(lines, split, strict=False)), default=0.0)
        found["ok"] = found["losses_equal"] and all(r["state_equal"] and r["scaler_equal"] for r in every)
    return found


def rank_program(out: Path, cpu: bool) -> None:
    import torch

    import torchslurm

    torch.use_deterministic_algorithms(True, warn_only=True)
    with torchslurm.init() as ctx:
        found = {"sharded_scaler": sharded_scaler(ctx, cpu), "resume": resume(ctx, out, cpu)}
        if ctx.is_main:
            found["device"] = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu"
            found["world_size"], found["backend"], found["torch"] = ctx.world_size, ctx.backend, torch.__version__
            found["cuda"] = torch.version.cuda
            (out / "found.json").write_text(json.dumps(found))


# ---- the launcher -------------------------------------------------------------------------------
def _environment(cpu: bool) -> dict[str, str]:
    """This machine's variables without another launcher's placement; the CPU forced with --cpu."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TORCHELASTIC_", "TORCHSLURM_", "OMPI_", "PMI_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    # cuBLAS is deterministic only with a fixed workspace (torch's reproducibility notes)
    env.update({"TORCH_CPP_LOG_LEVEL": "ERROR", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    if cpu:
        env["TORCHSLURM_DEVICE"] = "cpu"
    return env


def summary(found: dict[str, Any]) -> dict[str, Any]:
    """The one line: ok when both parts held on every rank."""
    scaler, resumed = found["sharded_scaler"], found["resume"]
    first = resumed["ranks"][0]
    return {"check": CHECK, "ok": bool(scaler["ok"] and resumed["ok"]), "device": found["device"],
            "world_size": found["world_size"], "backend": found["backend"], "torch": found["torch"],
            "cuda": found["cuda"], "scaler_skip_agreed": scaler["ok"], "trainer_sharded": first["trainer_sharded"],
            "resume_losses_equal": resumed["losses_equal"], "resume_state_equal": first["state_equal"],
            "resume_scaler_equal": first["scaler_equal"], "max_loss_diff": resumed["max_loss_diff"],
            "max_state_diff": max(r["max_state_diff"] for r in resumed["ranks"]), "scaler": first["scaler"],
            "losses_compared": resumed["losses"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="the reduced form on CPU ranks (Gloo)")
    parser.add_argument("--nproc", type=int, default=None, help="ranks (default: 2, or the GPUs seen when fewer)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds before the ranks are given up")
    parser.add_argument("--rank-of", type=Path, default=None, help=argparse.SUPPRESS)  # a rank, writing there
    args = parser.parse_args(argv)
    if args.rank_of is not None:
        rank_program(args.rank_of, args.cpu)
        return 0
    from torchslurm.runtime.launch import cuda_device_count

    gpus = 0 if args.cpu else cuda_device_count()
    if not args.cpu and gpus == 0:
        print(json.dumps({"check": CHECK, "ok": False, "skipped": "no CUDA device is visible here; amp=fp16 needs "
                          "one. HINT: run it on a GPU node, or with --cpu for the reduced form on CPU ranks."}))
        return 2
    nproc = args.nproc or (2 if args.cpu else min(2, gpus))
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fp16_fsdp-") as tmp:
        command = [sys.executable, "-m", "torchslurm", "run", "--nproc", str(nproc), __file__, "--rank-of", tmp,
                   *(["--cpu"] if args.cpu else [])]
        try:
            ran = subprocess.run(command, env=_environment(args.cpu), capture_output=True, text=True,
                                 timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(json.dumps({"check": CHECK, "ok": False, "error": f"the ranks ran past --timeout={args.timeout} s"}))
            return 1
        result = Path(tmp) / "found.json"
        if ran.returncode != 0 or not result.is_file():
            print(ran.stdout[-3000:] + ran.stderr[-5000:], file=sys.stderr)
            print(json.dumps({"check": CHECK, "ok": False, "error": f"the ranks exited {ran.returncode}"}))
            return 1
        line = summary(json.loads(result.read_text()))
    line["wall_s"] = round(time.monotonic() - start, 1)
    print(json.dumps(line))
    return 0 if line["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
