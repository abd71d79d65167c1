"""`torchslurm submit [spec flags] [SCRIPT ARGS...]`: write the script into the run directory and sbatch it."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchslurm.cli.script import add_spec_arguments, findings_of, report, spec_from_args


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "submit", help="render, check and sbatch a job; prints the job id and its log files",
        description="Render the job spec into <run-dir>/<name>.sbatch (relative log patterns are placed "
        "in the run directory, which is created), then `sbatch --parsable` it.")
    add_spec_arguments(parser)
    parser.add_argument("--run-dir", type=Path, default=None, metavar="DIR",
                        help="where the script and logs go (default: ./torchslurm-runs/<name>)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from torchslurm.jobs.slurm import SlurmClient
    from torchslurm.jobs.submit import submit

    spec = spec_from_args(args)
    # the GPU flag check needs the Slurm version; here Slurm is at hand, so ask it
    version = args.slurm_version or (SlurmClient().version() if spec.gpus_per_node else None)
    code = report(findings_of(spec, args, version, submitting=True), args.force)
    if code:
        return code
    job = submit(spec, run_dir=args.run_dir, force=True)
    assert job.spec is not None and job.script is not None
    print(f"submitted job {job.id}")
    print(f"  script: {job.script}")
    print(f"  output: {_expand(job.spec.output, job.spec.name, job.id)}")
    if job.spec.error:
        print(f"  error:  {_expand(job.spec.error, job.spec.name, job.id)}")
    print(f"  follow: torchslurm logs {job.id} -f")
    return 0


def _expand(pattern: str, name: str, job_id: str) -> str:
    """The common Slurm filename patterns (%x, %j, %%); others are left for Slurm."""
    return pattern.replace("%%", "\0").replace("%x", name).replace("%j", job_id).replace("\0", "%")
