"""Tokens per second of a GPT: torchslurm's Trainer against a hand-written loop doing the same work.

The same model (models.GPT; --size gpt2: 12 layers, 768 wide, 12 heads, 1024 tokens of context, a
vocabulary of 50304 with an untied head; gpt2-short: its weights and checkpoints with 64 tokens of
context and batches of 2, a CPU's size), the same data (seeded random token windows, held in memory),
batch, optimizer (AdamW, lr 6e-4, weight decay 0.1), bf16 autocast (--amp off: none, for CPUs that
emulate bf16), gradient clipping at 1.0 and torch.compile. The hand loop is written the way
nanoGPT-style scripts write one: torch.compile(model), a shuffled DataLoader with pinned memory and
non_blocking copies, autocast around forward and loss, clip, step, zero_grad(set_to_none=True); after
each epoch a validation pass and a torch.save of model and optimizer. The Trainer runs with
compile=true, amp=bf16 (or off), grad_clip=1.0 and a checkpoint each epoch.

Each round builds both afresh (same seed) and runs --epochs epochs of each, the order alternating from
round to round; one process, on the GPU (or --cpu). Reported per loop: tokens per second over the whole
run (every epoch, its validation and its checkpoint) less the seconds torch spent compiling (measured
the same way for both and reported apart), the median over rounds; the ratio Trainer / hand loop (goal
on a GPU: >= 0.98); and MFU against the card's dense bf16 peak. To tell where a difference lies: the
tokens per second of the training steps alone (the hand loop's timed per epoch with one synchronize at its
end, the Trainer's epoch_time_s) and the seconds besides them (start, validation, checkpoints, end), and
of those the phases timed (`phases_s`, compiling included: validation, the checkpoint or the wait for it,
the end's wait for the last checkpoint to be on disk and the deletion of the one before).
A warm-up round (--warmup) runs first and is left out: the first loop to run would pay the cold start.
It takes --warmup-steps steps per epoch (default: as many as --steps; a few are enough to compile, tune and
grow the allocator), so that long epochs, where a run's fixed costs weigh what they do in a real one, fit
in one call.
A benchmark: it asserts nothing.

    python benchmarks/tokens.py [--size gpt2|gpt2-short|small|tiny] [--cpu] [--amp off] [--rounds 3] [--steps 40]
                                [--warmup-steps 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch.utils.data import DataLoader, TensorDataset

SIZES = {  # layers, dim, heads, block_size, vocab, batch
    "gpt2": (12, 768, 12, 1024, 50304, 16),
    "gpt2-short": (12, 768, 12, 64, 50304, 2),  # gpt2's weights and checkpoints, steps a CPU can take
    "small": (4, 256, 4, 256, 4096, 16),
    "tiny": (2, 64, 4, 64, 256, 16),
}
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "GH200": 989e12}
"""Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets, by a name in the device's."""
LR, WEIGHT_DECAY, CLIP = 6e-4, 0.1, 1.0
STEPPING = "stepping.json"
"""The hand loop's seconds of training steps per epoch (the Trainer's are its epoch records' epoch_time_s)."""


def build(size: str, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torchslurm.train.models import GPT

    layers, dim, heads, block, vocab, _ = SIZES[size]
    torch.manual_seed(0)
    model = GPT(vocab=vocab, block_size=block, dim=dim, layers=layers, heads=heads).to(device)
    fused = {"fused": True} if device.type == "cuda" else {}
    return model, torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, **fused)


def token_data(size: str, steps: int) -> tuple[TensorDataset, TensorDataset]:
    """`steps` batches of training windows and a quarter as many of validation, random tokens."""
    _, _, _, block, vocab, batch = SIZES[size]
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(vocab, (steps * batch * 5 // 4, block + 1), generator=g)
    split = steps * batch
    return (TensorDataset(tokens[:split, :-1], tokens[:split, 1:]),
            TensorDataset(tokens[split:, :-1], tokens[split:, 1:]))


PHASES: dict[str, float] = {}
"""Seconds of the run in progress besides its steps, by phase (validation, checkpoint, ...)."""


@contextmanager
def phase(name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        PHASES[name] = PHASES.get(name, 0.0) + time.perf_counter() - started


@contextmanager
def trainer_phases() -> Iterator[None]:
    """The Trainer's phases, timed from outside: validation, each epoch-end save beside it (the save's
    wait is the difference), the end's wait for the last save to be on disk (finish), the deletion of
    the checkpoint before it (close)."""
    from torchslurm.train.checkpoint.checkpointer import Checkpointer
    from torchslurm.train.trainer import Trainer

    def timing(method: Callable[..., Any], name: str) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            with phase(name):
                result = method(*args, **kwargs)
                if torch.cuda.is_available() and isinstance(result, torch.Tensor):
                    torch.cuda.synchronize()  # validation's sums: done on the card, as the hand loop's .item()
                return result
        return run

    beside = Checkpointer.beside

    @contextmanager
    def timed_beside(*args: Any, **kwargs: Any) -> Iterator[None]:
        with phase("validation and the epoch's save beside it"), beside(*args, **kwargs):
            yield

    with ExitStack() as patches:
        for cls, attr, name in [(Trainer, "_validation_sums", "validation"),
                                (Checkpointer, "finish", "end: last save on disk"),
                                (Checkpointer, "close", "end: older checkpoints deleted")]:
            patches.enter_context(mock.patch.object(cls, attr, timing(getattr(cls, attr), name)))
        patches.enter_context(mock.patch.object(Checkpointer, "beside", timed_beside))
        yield


def compile_seconds() -> float:
    from torchslurm.train.compiling import compile_seconds as spent

    return spent()


def hand_loop(size: str, data: tuple[TensorDataset, TensorDataset], epochs: int, device: torch.device,
              out: Path, compile: bool, amp: str) -> None:
    model, optimizer = build(size, device)
    if compile:
        model = torch.compile(model)  # type: ignore[assignment]
    train, val = data
    batch = SIZES[size][5]
    g = torch.Generator().manual_seed(0)
    pin = device.type == "cuda"
    loader = DataLoader(train, batch_size=batch, shuffle=True, generator=g, pin_memory=pin)
    val_loader = DataLoader(val, batch_size=batch, pin_memory=pin)

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp == "bf16"):
            logits = model(x)
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    stepping: list[float] = []
    for _ in range(epochs):
        model.train()
        started = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss_of(x, y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()  # once an epoch: the steps' time, as the Trainer's epoch_time_s has it
        stepping.append(time.perf_counter() - started)
        model.eval()
        total = torch.zeros((), device=device)
        with phase("validation"), torch.no_grad():
            for x, y in val_loader:
                total += loss_of(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
            loss = total.item() / len(val_loader)
        print(f"hand loop: val loss {loss:.4f}", file=sys.stderr)
        with phase("checkpoint"):
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, out / "ckpt.pt")
    (out / STEPPING).write_text(json.dumps(stepping))


def trainer_loop(size: str, data: tuple[TensorDataset, TensorDataset], epochs: int, device: torch.device,
                 out: Path, ctx: Any, compile: bool, amp: str) -> Callable[[], None]:
    """The run; what to wait for before its run_dir goes (fit returns while curves.png is drawn)."""
    from torchslurm.train import tasks
    from torchslurm.train.config import TrainConfig
    from torchslurm.train.trainer import Trainer

    model, optimizer = build(size, device)
    config = TrainConfig(epochs=epochs, batch_size=SIZES[size][5], lr=LR, amp=amp, grad_clip=CLIP, compile=compile,
                         run_dir=out, resume="never", log_every=0, straggler_every=0, keep_last=1)
    flops = model.flops_per_token()  # type: ignore[operator]
    trainer = Trainer(model, optimizer, tasks.token_cross_entropy, data[0], data[1], config, ctx=ctx,
                      task=tasks.language_model(flops))
    with trainer_phases():
        trainer.fit()
    return trainer.curves.wait


def timed(run: Callable[[Path], Callable[[], None] | None],
          device: torch.device) -> tuple[float, float, float, dict[str, float]]:
    """(seconds of the whole run less compiling, seconds compiling, seconds of its training steps less
    compiling, the seconds of its phases besides the steps): the rest of the whole run is start, validation,
    checkpoints and end."""
    PHASES.clear()
    with tempfile.TemporaryDirectory(prefix="tokens-") as tmp:
        if device.type == "cuda":
            torch.cuda.synchronize()
        compiled, started = compile_seconds(), time.perf_counter()
        settle = run(Path(tmp))
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall, compiling = time.perf_counter() - started, compile_seconds() - compiled
        stepping = sum(stepping_seconds(Path(tmp)))
        if settle is not None:
            settle()  # outside the timing, before the folder goes
    return wall - compiling, compiling, stepping - compiling, dict(PHASES)


def stepping_seconds(out: Path) -> list[float]:
    """Per epoch, the seconds a run in `out` spent in its training steps."""
    if (out / STEPPING).exists():
        return list(json.loads((out / STEPPING).read_text()))
    records = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [r["epoch_time_s"] for r in records if r["kind"] == "epoch"]


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16.items() if key in name), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=SIZES, default=None, help="default: gpt2 on a GPU, small on the CPU")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1,
                        help="rounds run first and left out (the first loop to run pays the cold start: "
                             "kernels, autotuning, allocator; Dynamo's compile time does not count all of it)")
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="optimizer steps per epoch in the warm-up rounds (default: --steps)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="both loops uncompiled")
    parser.add_argument("--amp", choices=("bf16", "off"), default="bf16",
                        help="off: float32 (a CPU without bf16 instructions emulates it, slower than float32)")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    warmup_steps = args.steps if args.warmup_steps is None else args.warmup_steps
    if args.rounds < 1 or args.warmup < 0 or min(args.steps, warmup_steps, args.epochs) < 1:
        parser.error(f"expected --rounds >= 1, --warmup >= 0, --steps >= 1, --warmup-steps >= 1 and --epochs >= 1 "
                     f"(got {args.rounds}, {args.warmup}, {args.steps}, {warmup_steps}, {args.epochs}). "
                     "HINT: e.g. --rounds 2 --warmup 1 --warmup-steps 20 --steps 50")
    import torchslurm

    environ = {"TORCHSLURM_DEVICE": "cpu"} if args.cpu or not torch.cuda.is_available() else {}
    with torchslurm.init(environ={**os.environ, **environ}) as ctx:
        device = ctx.device
        size = args.size or ("gpt2" if device.type == "cuda" else "small")
        tokens = args.epochs * args.steps * SIZES[size][5] * SIZES[size][3]

        def loops(steps: int) -> dict[str, Callable[[Path], Callable[[], None] | None]]:
            data = token_data(size, steps)
            return {"hand loop": lambda out: hand_loop(size, data, args.epochs, device, out, args.compile, args.amp),
                    "Trainer": lambda out: trainer_loop(size, data, args.epochs, device, out, ctx, args.compile,
                                                        args.amp)}

        warm, timed_loops = loops(warmup_steps), loops(args.steps)
        seconds: dict[str, list[float]] = {name: [] for name in timed_loops}
        compiling: dict[str, list[float]] = {name: [] for name in timed_loops}
        stepping: dict[str, list[float]] = {name: [] for name in timed_loops}
        phases: dict[str, list[dict[str, float]]] = {name: [] for name in timed_loops}
        for r in range(-args.warmup, args.rounds):
            these = timed_loops if r >= 0 else warm
            for name in (list(these) if r % 2 == 0 else list(reversed(these))):
                s, c, steps, parts = timed(these[name], device)
                if r >= 0:
                    seconds[name].append(s)
                    compiling[name].append(c)
                    stepping[name].append(steps)
                    phases[name].append(parts)
                label = f"round {r}" if r >= 0 else "warm-up"
                ran = tokens if r >= 0 else tokens * warmup_steps // args.steps
                print(f"{label} {name}: {ran / s:,.0f} tokens/s ({s:.2f} s, {steps:.2f} s of it steps, "
                      f"+ {c:.1f} s compiling)", file=sys.stderr, flush=True)
        model, _ = build(size, device)
        flops = model.flops_per_token()  # type: ignore[operator]
        params = sum(p.numel() for p in model.parameters())
    rate = {name: tokens / statistics.median(s) for name, s in seconds.items()}
    peak = peak_flops(device)
    result = {
        "size": size, "parameters": params, "compile": args.compile, "amp": args.amp,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "tokens_per_run": tokens, "rounds": args.rounds, "warmup_rounds": args.warmup,
        "steps_per_epoch": args.steps, "epochs": args.epochs, "warmup_steps_per_epoch": warmup_steps,
        "tokens_per_s": rate, "ratio": rate["Trainer"] / rate["hand loop"],
        "compile_s": {name: statistics.median(c) for name, c in compiling.items()},
        "steps_tokens_per_s": {name: tokens / statistics.median(s) for name, s in stepping.items()},
        "besides_steps_s": {name: statistics.median(w - t for w, t in zip(seconds[name], stepping[name], strict=True))
                            for name in timed_loops},
        "phases_s": {name: {key: statistics.median(p.get(key, 0.0) for p in runs) for key in runs[0]}
                     for name, runs in phases.items()},
        "mfu": {name: r * flops / peak for name, r in rate.items()} if peak else None,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
