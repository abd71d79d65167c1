"""torchslurm's Trainer against its peers: the same model, data, seed and batch in each framework.

    (a) seed     a hand-written seed-style DDP loop (init_process_group, DistributedSampler, DDP,
                 all_reduce'd metrics)
    (b) torchslurm  torchslurm.Trainer, as examples/simple_model.py drives it
    (c) fabric   Lightning Fabric (fabric.setup / fabric.backward)        } when installed:
    (d) lightning  the Lightning Trainer (LightningModule + trainer.fit)   } pip install '.[bench]'
    (e) accelerate  Hugging Face Accelerate (accelerator.prepare / backward)

Each run is `python -m torch.distributed.run --standalone --nproc-per-node 2` with 2 Gloo ranks on
the CPU, several short epochs, each ending in a validation pass (that is where epoch-end costs
show). The frameworks take turns within each round (round 1: a b c d e, round 2: a b c d e, ...),
so drift in machine load hits them alike. Rank 0 stamps the time after every optimizer step and at
the end of the run; two figures per framework, the median over rounds:

    steady step  the median interval between optimizer steps
    whole run    (end of the last epoch − first step) / the steps after the first: the per-step
                 cost once epoch ends (validation, metrics, logging, checkpoints) are included

plus the ratios to (a) (median of the per-round ratios), the mean epoch-end cost (beyond a steady
step) and the start-up to the first step. The torchslurm Trainer always ends with a checkpoint;
`--final-checkpoint` has every other framework write one too, its own way (rank 0 torch.save,
fabric.save, trainer.save_checkpoint, accelerator.save_state), so that all do the same work.
Workloads: conv (SimpleConvNet on 1×28×28 synthetic images: compute-bound) and mlp (10→50→10:
overhead-bound); synthetic in-memory data from the seed.
Writes a JSON file and a bar chart (PNG) and prints a table. A benchmark: it reports, asserts nothing.

    python benchmarks/peers.py [--rounds 5] [--epochs 4] [--steps 50] [--batch-size 64] [--final-checkpoint]
        [--workloads conv mlp] [--frameworks seed torchslurm fabric lightning accelerate] [--out runs/bench/peers]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

WORKERS = Path(__file__).resolve().parent / "_peer_workers"
NPROC = 2


@dataclass(frozen=True)
class Framework:
    key: str
    label: str
    requires: str | None
    """The distribution that must be installed (None: torch alone)."""


FRAMEWORKS = (
    Framework("seed", "(a) seed-style DDP", None),
    Framework("torchslurm", "(b) torchslurm Trainer", "torchslurm"),
    Framework("fabric", "(c) Lightning Fabric", "lightning"),
    Framework("lightning", "(d) Lightning Trainer", "lightning"),
    Framework("accelerate", "(e) Accelerate", "accelerate"),
)
BY_KEY = {f.key: f for f in FRAMEWORKS}
WORKLOADS = {"conv": "SimpleConvNet, 1×28×28 synthetic images (compute-bound)",
             "mlp": "MLP 10→50→10, synthetic features (overhead-bound)"}


class WorkerFailed(Exception):
    """A torchrun run exited non-zero or wrote no record."""


@dataclass(frozen=True)
class Figures:
    """One run, from rank 0's stamps (milliseconds unless named otherwise)."""

    steady_ms: float
    whole_ms: float
    epoch_end_ms: float
    """Mean over epochs of what an epoch's end costs beyond one steady step."""
    first_step_s: float
    """Process start to the end of the first optimizer step (imports, init, wrapping, first step)."""
    steps: int
    val_accuracy: float


def figures(record: dict[str, Any]) -> Figures:
    stamps: list[float] = record["step_stamps"]
    per_epoch, epochs = record["steps_per_epoch"], record["epochs"]
    if len(stamps) != per_epoch * epochs:
        raise WorkerFailed(f"{record['framework']}/{record['workload']} took {len(stamps)} optimizer steps, "
                           f"expected {epochs} epochs × {per_epoch}; the loops are not comparable")
    intervals = [b - a for a, b in itertools.pairwise(stamps)]
    steady = statistics.median(intervals)
    # The interval that crosses each epoch boundary holds that epoch's end; the last epoch's end is the tail.
    boundaries = [intervals[k * per_epoch - 1] for k in range(1, epochs)] + [record["end"] - stamps[-1]]
    return Figures(
        steady_ms=1000 * steady,
        whole_ms=1000 * (record["end"] - stamps[0]) / max(1, len(stamps) - 1),
        epoch_end_ms=1000 * statistics.mean(b - steady for b in boundaries),
        first_step_s=stamps[0] - record["process_start"],
        steps=len(stamps),
        val_accuracy=record["val_accuracy"],
    )


def run_worker(framework: str, workload: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """One torchrun run of one framework; rank 0's record."""
    out = scratch / "record.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(NPROC),
               str(WORKERS / "worker.py"), framework, "--workload", workload, "--epochs", str(args.epochs),
               "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--seed", str(args.seed),
               "--out", str(out), "--scratch", str(scratch), *(["--final-checkpoint"] if args.final_checkpoint else [])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, cwd=scratch)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        raise WorkerFailed(f"{framework}/{workload} ran past --timeout {args.timeout} s\n"
                           f"  command: {' '.join(command)}\n{worker_stderr(stderr, args.tail)}") from exc
    if done.returncode != 0 or not out.is_file():
        why = f"exited {done.returncode}" if done.returncode else "wrote no record"
        raise WorkerFailed(f"{framework}/{workload} {why}\n  command: {' '.join(command)}\n"
                           f"{worker_stderr(done.stderr or done.stdout, args.tail)}")
    record: dict[str, Any] = json.loads(out.read_text())
    return record


def worker_stderr(stderr: str, tail: int) -> str:
    """The last `tail` lines the ranks wrote, without torchrun's own report of the failure that follows
    them (its agent's traceback and the ChildFailedError summary say only which rank exited)."""
    lines = stderr.rstrip().splitlines()
    agent = next((i for i, line in enumerate(lines) if "torch/distributed/elastic/" in line and "failed" in line), None)
    ranks = lines[:agent] if agent else lines
    return f"  last {tail} lines the ranks wrote to stderr:\n" + "\n".join(ranks[-tail:])


def machine() -> dict[str, Any]:
    """What the figures were taken on."""
    cpu = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    versions = {}
    for dist in ("torch", "torchslurm", "lightning", "accelerate"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "platform": platform.platform(), **versions,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def available(keys: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The frameworks that can run, and why each other one is skipped."""
    usable, skipped = [], {}
    for key in keys:
        need = BY_KEY[key].requires
        if need is None or importlib.util.find_spec(need) is not None:
            usable.append(key)
        else:
            skipped[key] = f"{need} is not installed (pip install '.[bench]')"
    return usable, skipped


def summarise(runs: dict[str, dict[str, list[Figures]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per workload and framework: medians over rounds, and the median per-round ratio to (a)."""
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for workload, by_framework in runs.items():
        base = by_framework.get("seed")
        summary[workload] = {}
        for key, rounds in by_framework.items():
            row = {name: statistics.median(getattr(f, name) for f in rounds)
                   for name in ("steady_ms", "whole_ms", "epoch_end_ms", "first_step_s", "val_accuracy")}
            if base:
                row["steady_ratio"] = statistics.median(f.steady_ms / b.steady_ms for f, b in zip(rounds, base,
                                                                                                  strict=True))
                row["whole_ratio"] = statistics.median(f.whole_ms / b.whole_ms for f, b in zip(rounds, base,
                                                                                              strict=True))
            summary[workload][key] = row
    return summary


def print_table(summary: dict[str, dict[str, dict[str, float]]], args: argparse.Namespace,
                host: dict[str, Any], on: dict[str, list[str]], skipped: dict[str, str]) -> None:
    print(f"\npeers: {NPROC} Gloo ranks on CPU under torchrun, batch {args.batch_size}/rank, {args.epochs} epochs × "
          f"{args.steps} steps (validation after each), seed {args.seed}, {args.rounds} round(s); medians over rounds; "
          + ("every framework writes a final checkpoint" if args.final_checkpoint
             else "only the torchslurm Trainer writes a final checkpoint"))
    print(f"machine: {host['cpu']}, {host['cores']} cores ({host['usable_cores']} usable), torch {host['torch']}, "
          f"lightning {host['lightning']}, accelerate {host['accelerate']}, python {host['python']}, {host['date']}")
    for workload, rows in summary.items():
        print(f"\n{workload}: {WORKLOADS[workload]}")
        print(f"  {'framework':24s} {'steady ms/step':>14s} {'×(a)':>6s} {'whole ms/step':>14s} {'×(a)':>6s} "
              f"{'epoch end ms':>13s} {'to 1st step s':>14s} {'val acc':>8s}")
        for key, row in rows.items():
            print(f"  {BY_KEY[key].label:24s} {row['steady_ms']:14.3f} {row.get('steady_ratio', float('nan')):6.2f} "
                  f"{row['whole_ms']:14.3f} {row.get('whole_ratio', float('nan')):6.2f} {row['epoch_end_ms']:13.1f} "
                  f"{row['first_step_s']:14.2f} {100 * row['val_accuracy']:7.1f}%")
    print("\nwhat each variant has on:")
    for key, items in on.items():
        print(f"  {BY_KEY[key].label}: {'; '.join(items)}")
    for key, why in skipped.items():
        print(f"  {BY_KEY[key].label}: skipped, {why}")


def plot(summary: dict[str, dict[str, dict[str, float]]], path: Path, title: str) -> None:
    """Steady and whole-run ms/step per framework, one panel per workload, ratios to (a) on the bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summary), figsize=(6.5 * len(summary), 4.2), squeeze=False)
    for ax, (workload, rows) in zip(axes[0], summary.items(), strict=True):
        keys = list(rows)
        xs = range(len(keys))
        for offset, (name, label) in zip((-0.2, 0.2), (("steady", "steady step"), ("whole", "whole run")),
                                         strict=True):
            bars = ax.bar([x + offset for x in xs], [rows[k][f"{name}_ms"] for k in keys], width=0.4, label=label)
            ratios = [rows[k].get(f"{name}_ratio") for k in keys]
            ax.bar_label(bars, [f"×{r:.2f}" if r is not None else "" for r in ratios], fontsize=7)
        ax.set_xticks(list(xs), [BY_KEY[k].label.replace(" ", "\n", 1) for k in keys], fontsize=8)
        ax.set(title=f"{workload}: {WORKLOADS[workload]}", ylabel="ms per optimizer step")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="runs of every framework, interleaved (default 5)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run, each with validation (default 4)")
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps per epoch (default 50)")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank per step (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--frameworks", nargs="+", choices=list(BY_KEY), default=list(BY_KEY),
                        help="default: all; those not installed are skipped with a note")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/peers"),
                        help="writes OUT.json and OUT.png (default runs/bench/peers)")
    parser.add_argument("--final-checkpoint", action="store_true",
                        help="every framework writes one resumable checkpoint after the last epoch, its own way "
                             "(the torchslurm Trainer always does)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one run may take (default 600)")
    parser.add_argument("--tail", type=int, default=40, help="lines of a failed run's output to show (default 40)")
    args = parser.parse_args(argv)
    for name in ("rounds", "epochs", "steps", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}: expected at least 1")
    if args.epochs * args.steps < 2:
        parser.error("--epochs × --steps must be at least 2: the figures are intervals between steps")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    keys, skipped = available(args.frameworks)
    host = machine()
    runs: dict[str, dict[str, list[Figures]]] = {w: {k: [] for k in keys} for w in args.workloads}
    records: list[dict[str, Any]] = []
    on: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        for r in range(1, args.rounds + 1):
            for workload in args.workloads:
                for key in keys:
                    scratch = Path(tmp) / f"{r}-{workload}-{key}"
                    scratch.mkdir()
                    try:
                        record = run_worker(key, workload, args, scratch)
                        runs[workload][key].append(figures(record))
                    except WorkerFailed as exc:
                        print(f"error: round {r}: {exc}", file=sys.stderr)
                        return 1
                    on[key] = record["on"]
                    records.append({"round": r, **record})
                    f = runs[workload][key][-1]
                    print(f"round {r}/{args.rounds} {workload:4s} {BY_KEY[key].label:24s} steady {f.steady_ms:8.3f} "
                          f"ms/step, whole {f.whole_ms:8.3f} ms/step, val acc {100 * f.val_accuracy:5.1f}%",
                          flush=True)
    summary = summarise(runs)
    print_table(summary, args, host, on, skipped)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    json_path, png_path = args.out.with_suffix(".json"), args.out.with_suffix(".png")
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    json_path.write_text(json.dumps({
        "machine": host, "settings": {**settings, "nproc": NPROC, "backend": "gloo"}, "summary": summary,
        "on": on, "skipped": skipped,
        "runs": {w: {k: [asdict(f) for f in fs] for k, fs in by.items()} for w, by in runs.items()},
        "records": records}, indent=1))
    plot(summary, png_path, f"{NPROC} Gloo ranks, batch {args.batch_size}/rank, {args.epochs}×{args.steps} steps, "
         f"{args.rounds} round(s); {host['cpu']}, torch {host['torch']}, {host['date']}")
    print(f"\nwrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
