"""`torchslurm submit [spec flags] [SCRIPT ARGS...]`: write the script into the run directory and sbatch it."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchslurm.cli.sandbox import hint_sandbox
from torchslurm.cli.script import add_spec_arguments, report, spec_from_args


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "submit", help="render, check and sbatch a job; prints the job id and its log files",
        description="Render the job spec into <run-dir>/<name>.sbatch (<name>-2.sbatch, ... when taken: one "
        "file per submission; relative log patterns are placed in the run directory, which is created), then "
        "`sbatch --parsable` it. Without --name the job is named after its script.")
    add_spec_arguments(parser)
    parser.add_argument("--run-dir", type=Path, default=None, metavar="DIR",
                        help="where the script and logs go (default: ./torchslurm-runs/<name>)")
    parser.set_defaults(handler=hint_sandbox(handle))


def handle(args: argparse.Namespace) -> int:
    from torchslurm.jobs.asked import findings
    from torchslurm.jobs.findings import by_severity
    from torchslurm.jobs.slurm import SlurmClient
    from torchslurm.jobs.submit import expand_pattern, never_starts, submit

    asked = spec_from_args(args)
    client = SlurmClient()
    # the GPU flag check needs the Slurm version; here Slurm is at hand, so ask it
    version = args.slurm_version or (client.version() if asked.spec.gpus_per_node else None)
    found = [*findings(asked, version, Path.cwd(), submitting=True), *never_starts(asked.spec, client, asked.spelling)]
    code = report(by_severity(found), args.force)
    if code:
        return code
    job = submit(asked.spec, run_dir=args.run_dir, client=client, force=True)
    assert job.spec is not None and job.script is not None
    known = {"x": job.spec.name, "j": job.id}
    print(f"submitted job {job.id}")
    print(f"  script: {job.script}")
    print(f"  output: {expand_pattern(job.spec.output, known)}")
    if job.spec.error:
        print(f"  error:  {expand_pattern(job.spec.error, known)}")
    print(f"  follow: torchslurm logs {job.id} -f")
    return 0
