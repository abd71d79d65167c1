"""Training script of the preemption tests: Trainer + Preemption on synthetic data.

    torchslurm run --nproc 2 preempt_train.py run_dir=DIR [epochs=3] [signal_at=RANK:STEP] ...

key=value arguments (all optional but run_dir):
  epochs, samples, batch_size, checkpoint_every_steps, seed — the TrainConfig / data knobs;
  signal_at=RANK:STEP — that rank sends itself the preemption signal (a real kill) just before the
                        boundary check after optimizer step STEP, once per run_dir;
  signal=NAME         — which signal signal_at sends (default: the configured one, USR2; KILL: a crash);
  raise_at=RANK:STEP  — that rank raises ValueError at that boundary instead (an error of its own);
  ballast_mb=N        — a frozen parameter of N MiB: makes checkpoints large (kill -9 mid-save);
  step_sleep=S        — sleep S seconds per step (gives tests time to act mid-training);
  requeued_step_sleep=S — the same in a run after a Slurm requeue (SLURM_RESTART_COUNT > 0), step_sleep
                        unless given: 0 where the test has done its part by then, so the rest runs at full speed;
  timeout_s=S         — the process group timeout (torchslurm.init), the bound on a hang;
  linger_s=S          — after an uninterrupted finish (and final.pt), stay S seconds (a Ctrl-C then: exit 130).
A peer failure ends every rank with one root-cause message (torchslurm.train.watchdog); then
local rank 0 of each node requeues the job (within TORCHSLURM_MAX_REQUEUES; under torchrun only
once the agents have no restarts left: until then they restart the workers, which resume).
Writes DIR/pids/rank<R>.pid at start and, after an uninterrupted finish, DIR/final.pt (rank 0).
Exit code: 0 when training finished, 75 (PREEMPTED_EXIT_CODE) after a stop on request.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

import torch
from torch import nn

import torchslurm
from torchslurm.errors import TorchSlurmError
from torchslurm.exitcodes import INTERRUPTED_EXIT_CODE
from torchslurm.jobs.slurm import run_command_status
from torchslurm.train import data, preemption, requeue, watchdog
from torchslurm.train.trainer import TrainConfig, Trainer


class Model(nn.Module):
    def __init__(self, ballast_mb: int) -> None:
        super().__init__()
        self.net1, self.net2 = nn.Linear(10, 32), nn.Linear(32, 2)
        # requires_grad=False: DDP neither reduces nor broadcasts it, yet it is saved.
        self.ballast = nn.Parameter(torch.zeros(ballast_mb * 2**18), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net2(torch.relu(self.net1(x)))
        return out


def main(argv: list[str]) -> int:
    try:
        return train(dict(a.split("=", 1) for a in argv))
    except TorchSlurmError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code


def train(args: dict[str, str]) -> int:
    run_dir = Path(args["run_dir"])
    timeout_s = float(args.get("timeout_s", 60))
    with torchslurm.init(timeout_s=timeout_s) as ctx:
        logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                            format=f"%(asctime)s [rank {ctx.rank} {socket.gethostname()}] %(name)s %(message)s")
        (run_dir / "pids").mkdir(parents=True, exist_ok=True)
        (run_dir / "pids" / f"rank{ctx.rank}.pid").write_text(f"{os.getpid()} {socket.gethostname()}\n")
        logging.getLogger("preempt_train").info("pid %d, store prefix %s, torchrun restart count %s", os.getpid(),
                                                ctx.store_prefix, os.environ.get("TORCHELASTIC_RESTART_COUNT", "-"))
        config = TrainConfig(epochs=int(args.get("epochs", 3)), batch_size=int(args.get("batch_size", 16)),
                             lr=0.05, seed=int(args.get("seed", 7)), run_dir=run_dir, log_every=0,
                             checkpoint_every_steps=int(args.get("checkpoint_every_steps", 0)),
                             hang_action="wait")  # this script's own watchdog ends and requeues the run
        torch.manual_seed(config.seed)
        model = Model(int(args.get("ballast_mb", 0)))
        train, val = data.synthetic(num_samples=int(args.get("samples", 400)), seed=3)
        stop = preemption.Preemption(
            preemption.preemption_config(os.environ, run=run_command_status if ctx.rank == 0 else None))
        sleep_s = float(args.get("step_sleep", 0))
        if int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0:
            sleep_s = float(args.get("requeued_step_sleep", sleep_s))
        who, _, when = args.get("signal_at", "-1:-1").partition(":")
        sig = signal.Signals["SIG" + args.get("signal", stop.config.signal).upper().removeprefix("SIG")]
        trainer: Trainer

        fired = run_dir / f"signal_at-{who}-{when}.done"  # once: a restarted run passes the step again

        def boundary() -> bool:
            if f"{ctx.rank}:{trainer.global_step}" == args.get("raise_at"):
                raise ValueError(f"injected failure at step {trainer.global_step}")
            if ctx.rank == int(who) and trainer.global_step == int(when) and not fired.exists():
                fired.touch()
                os.kill(os.getpid(), sig)
            if sleep_s:
                time.sleep(sleep_s)
            return stop.should_stop()

        after_failure = stop.requeue_after_failure if requeue.requeues_after_failure(ctx.env) else None
        dog = watchdog.Watchdog(ctx, bound_s=timeout_s, on_failure=after_failure)
        with stop, dog, dog.guard():
            trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                              nn.CrossEntropyLoss(), train, val, config, ctx=ctx, should_stop=boundary)
            result = trainer.fit()
            if result.stopped_early:
                print(f"rank {ctx.rank}: stopped at step {result.global_step}\n", end="", flush=True)
                return stop.finish()
        linger_s = float(args.get("linger_s", 0))
        if linger_s:
            torch.distributed.barrier()  # every rank is past its training before final.pt says it is done
        if ctx.is_main:
            torch.save(model.state_dict(), run_dir / "final.pt")
        try:
            time.sleep(linger_s)
        except KeyboardInterrupt:
            return INTERRUPTED_EXIT_CODE
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
