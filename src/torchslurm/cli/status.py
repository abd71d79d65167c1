"""`torchslurm status [JOB]`: the queue, or one job (scontrol when it already left the queue)."""

from __future__ import annotations

import argparse
import getpass
import json
import os
from pathlib import Path

from torchslurm.cli.sandbox import hint_sandbox


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status", help="show your jobs, or one job's state, exit code and logs",
        description="Without JOB: your jobs in the queue (squeue: id, state, elapsed time and limit, nodes, "
        "reason or node list, name). With JOB: its state, reason, nodes, elapsed time, exit code, restarts "
        "and log files, from scontrol, so also for a job that has just left the queue; for a Trainer's job also "
        "its stragglers (read from its run_dir).")
    parser.add_argument("job", nargs="?", help="job id (default: all your queued jobs)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="the job's run_dir, for its stragglers (default: the one its Trainer recorded)")
    parser.set_defaults(handler=hint_sandbox(handle))


def handle(args: argparse.Namespace) -> int:
    from torchslurm.jobs.slurm import SlurmClient
    from torchslurm.jobs.slurmoutput import explain_reason

    client = SlurmClient()
    if args.job is None:
        rows = client.queue(user=getpass.getuser())
        print(f"{'JOBID':<10} {'STATE':<11} {'TIME':>10} {'LIMIT':>10} {'NODES':>5}  REASON/NODELIST  NAME")
        for r in rows:
            print(f"{r.job_id:<10} {r.state:<11} {r.elapsed:>10} {r.time_limit:>10} {r.nodes:>5}  "
                  f"{r.reason:<16} {r.name}")
        for reason in dict.fromkeys(r.reason for r in rows if r.state == "PENDING"):
            if explain_reason(reason) != reason:
                print(f"  {explain_reason(reason)}")
        return 0
    st = client.status(args.job)
    print(f"job {st.job_id} ({st.name}): {st.state}")
    print(f"  reason:   {explain_reason(st.reason) if st.state == 'PENDING' else st.reason}")
    print(f"  nodes:    {st.nodes or '-'}")
    print(f"  elapsed:  {st.elapsed} of {st.time_limit}")
    if st.finished:
        print(f"  exit:     {st.exit_code}")
    if st.restarts:
        print(f"  restarts: {st.restarts}")
    if st.excluded:
        print(f"  excluded: {st.excluded} (ExcNodeList: --exclude, or nodes a node-level failure took out)")
    print(f"  stdout:   {st.stdout}")
    if st.stderr and st.stderr != st.stdout:
        print(f"  stderr:   {st.stderr}")
    for line in run_lines(args.job, args.run_dir):
        print(f"  {line}")
    return 0


def run_lines(job: str, run_dir: Path | None) -> list[str]:
    """The run_dir of the job's Trainer and its latest straggler verdict; [] when neither is known."""
    from torchslurm.jobs.rundir import recall
    from torchslurm.train.stragglers import STRAGGLERS_FILE, status_lines

    run_dir = run_dir or recall(job, os.environ)
    if run_dir is None:
        return []
    try:
        health = json.loads((run_dir / STRAGGLERS_FILE).read_text())
    except (OSError, ValueError):
        return [f"run_dir:  {run_dir}"]
    return [f"run_dir:  {run_dir}", *status_lines(health)]
