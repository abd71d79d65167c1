"""`torchslurm train [--config cfg.yaml] [--nproc N] [key=value …]`: train a built-in example.

The command validates the configuration (no torch needed), then starts the ranks the way
`torchslurm run` does — N local ranks here, srun across an allocation in a batch shell, or this
process as one rank under srun/torchrun — each rank running `python -m torchslurm.cli.train`.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchslurm.cli.ending import exit_process

if TYPE_CHECKING:
    from torchslurm.train.config import ExampleConfig, TrainConfig

logger = logging.getLogger(__name__)

# The demo: SimpleConvNet on the bundled digits, a few quick epochs (≥ 90 % validation accuracy).
DEFAULTS: dict[str, Any] = {"epochs": 4, "batch_size": 32, "lr": 0.05, "run_dir": "runs/demo", "log_every": 10}
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {"text": {"epochs": 2, "lr": 0.003, "run_dir": "runs/gpt"}}
"""Over DEFAULTS for a dataset (GPT trains with AdamW, whose usual lr is far below SGD's); your settings win."""
RANK_MODULE = "torchslurm.cli.train"
"""What each rank runs (`python -m`): this module, whose `__main__` block is `rank_main`."""
FLAGS = ("epochs", "batch_size", "lr", "data_dir", "run_dir")
"""The settings that also have a --flag (the classic training script's flags)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "train", help="train a built-in example (default: SimpleConvNet on digits) on N ranks",
        description="Train a built-in example with the torchslurm Trainer: locally on N ranks, or across "
        "the Slurm allocation when run in an sbatch/salloc shell. Resumes from run_dir automatically.",
    )
    parser.add_argument("--nproc", type=int, default=None, metavar="N",
                        help="ranks on this machine (per node inside an allocation); default 2 on CPU")
    parser.add_argument("--dry-run", action="store_true", help="print the settings and the launch, then exit")
    add_arguments(parser)
    parser.set_defaults(handler=handle)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The classic training script's flags (--epochs --batch-size --lr --data-dir --checkpoint-dir),
    --config and key=value: the same for the command and for each rank."""
    from torchslurm.train.config import valid_keys

    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="YAML or TOML file of key: value settings")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None, help="per rank")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (before lr_scaling)")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--run-dir", "--checkpoint-dir", dest="run_dir", type=Path, default=None,
                        help="checkpoints, metrics.jsonl and curves.png go here")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help=f"any other setting; keys: {', '.join(valid_keys())}")


def from_arguments(args: argparse.Namespace, defaults: Mapping[str, Any] = DEFAULTS
                   ) -> tuple[ExampleConfig, TrainConfig]:
    """The configs from `add_arguments`' flags, the --config file and key=value overrides, over
    `defaults` (the demo's, unless a script of your own passes its own)."""
    from torchslurm.train import config

    flags = {name: getattr(args, name) for name in FLAGS}
    example, cfg = config.load(args.config, args.overrides, defaults, flags)
    if defaults is DEFAULTS and example.dataset in DATASET_DEFAULTS:
        example, cfg = config.load(args.config, args.overrides, {**defaults, **DATASET_DEFAULTS[example.dataset]},
                                   flags)
    return example, cfg


def handle(args: argparse.Namespace) -> int:
    from torchslurm.runtime import launch
    from torchslurm.runtime.devices import gpus_unseen
    from torchslurm.train import config

    example, cfg = from_arguments(args)  # fail here, not in N ranks
    cuda_devices = launch.cuda_device_count()
    config.preflight(example, cfg, cuda_devices)  # paths and amp=fp16 too, before the ranks' start-up
    if unseen := gpus_unseen(os.environ, cuda_devices):  # GPUs from Slurm, none for torch: not silently CPU
        raise unseen
    flags = [f"{k}={getattr(args, k)}" for k in FLAGS if getattr(args, k) is not None]
    rank_args = [*(["--config", str(args.config)] if args.config else []), *flags, *args.overrides]
    plan = launch.plan(os.environ, RANK_MODULE, rank_args, args.nproc, sys.executable, cuda_devices, module=True)
    if args.dry_run:
        print(f"dataset={example.dataset} model={example.resolved_model} strategy={cfg.strategy} epochs={cfg.epochs} "
              f"batch_size={cfg.batch_size} lr={cfg.lr} lr_scaling={cfg.lr_scaling} amp={cfg.amp} "
              f"grad_clip={cfg.grad_clip} seed={cfg.seed} run_dir={cfg.run_dir} resume={cfg.resume}")
        print(f"{plan.mode}: {plan.reason}")
        print(shlex.join(plan.argv))
        return 0
    logger.info("%s", plan.reason)
    return launch.execute(plan, os.environ)


class _RankFormatter(logging.Formatter):
    """Rank 0's INFO lines bare (the classic script's output); warnings and errors say which rank."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        return message if record.levelno == logging.INFO else f"[rank {self.rank}] {record.levelname}: {message}"


def _setup_rank_logging(rank: int) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_RankFormatter(rank))
    root = logging.getLogger("torchslurm")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    root.propagate = False


def rank_main(argv: Sequence[str] | None = None) -> int:
    """The program of each rank: build data, model and optimizer, then Trainer.fit()."""
    import torch

    import torchslurm
    from torchslurm.errors import ConfigError, TorchSlurmError
    from torchslurm.exitcodes import INTERRUPTED_EXIT_CODE
    from torchslurm.jobs.slurm import run_command_status
    from torchslurm.train import config, data, models, tasks
    from torchslurm.train.preemption import preemption_config
    from torchslurm.train.trackers import outputs
    from torchslurm.train.trainer import Trainer, seed_everything

    parser = argparse.ArgumentParser(prog="torchslurm train (rank)")
    add_arguments(parser)
    args = parser.parse_intermixed_args(argv)
    try:
        example, cfg = from_arguments(args)
        with torchslurm.init() as ctx:
            _setup_rank_logging(ctx.rank)
            ConfigError.raise_any([config.device_problem(cfg, ctx.device.type)])  # before loading the data
            train, val = data.limited(data.load(example.dataset, example.data_dir, example.val_fraction, seed=0),
                                      example.max_samples)
            seed_everything(cfg.seed)  # identical initial weights on every rank and every run
            model = models.build(example.resolved_model, *data.describe(train))
            loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.nn.functional.cross_entropy
            task = tasks.classification()
            optimizer: torch.optim.Optimizer
            if isinstance(model, models.GPT):
                loss_fn, task = tasks.token_cross_entropy, tasks.language_model(model.flops_per_token())
                optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
            else:
                optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=example.momentum)
            # The Trainer's own preemption and watchdog: a warning signal, SIGTERM or the job's
            # deadline stops every rank after the same step (checkpoint, requeue, exit 75); a dead
            # peer ends every rank with one message naming it. Rank 0 alone asks Slurm for the
            # deadline: the ranks' agreement spreads its decision.
            stop = preemption_config(os.environ, run_command_status if ctx.is_main else None)
            result = Trainer(model, optimizer, loss_fn, train, val, cfg, ctx=ctx, preemption=stop,
                             environ=os.environ, task=task).fit()
            if result.stopped_early:
                return result.exit_code
            if ctx.is_main:
                _print_outputs(cfg.run_dir, result.checkpoint, outputs(cfg.to_dict(), os.environ))
    except TorchSlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code  # 2 for settings, 1 for a run that failed (a checkpoint not written)
    except KeyboardInterrupt:  # a second Ctrl-C, or one after the end: the launcher says what it means
        return INTERRUPTED_EXIT_CODE
    return 0


def _print_outputs(run_dir: Path, last_checkpoint: Path | None, trackers: Sequence[tuple[str, str]] = ()) -> None:
    print(f"Outputs in {run_dir}:")
    print(f"  checkpoints  {last_checkpoint or run_dir / 'checkpoints'}")
    print(f"  metrics      {run_dir / 'metrics.jsonl'}")
    print(f"  plot         {run_dir / 'curves.png'}")
    print(f"  tensorboard  {run_dir / 'tensorboard'}  (tensorboard --logdir {run_dir})")
    for name, where in trackers:
        print(f"  {name:<11}  {where}")
    print(f"To go on: torchslurm train run_dir={run_dir} epochs=N continues from the newest checkpoint.")


if __name__ == "__main__":  # a rank: `python -m torchslurm.cli.train`, started by `torchslurm train`
    exit_process(rank_main())
