"""`torchslurm submit [spec flags] [SCRIPT ARGS...]`: write the script into the run directory and sbatch it."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchslurm.cli.script import add_spec_arguments, findings_of, log_dirs, report, spec_from_args
from torchslurm.errors import ConfigError
from torchslurm.jobspec import JobSpec


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
    from torchslurm.job import submit
    from torchslurm.slurm import SlurmClient

    spec = spec_from_args(args)
    # the GPU flag check needs the Slurm version; here Slurm is at hand, so ask it
    version = args.slurm_version or (SlurmClient().version() if spec.gpus_per_node else None)
    code = report(findings_of(spec, args, version, submitting=True), args.force)
    if code:
        return code
    make_log_dirs(spec)
    job = submit(spec, run_dir=args.run_dir, force=True)
    assert job.spec is not None and job.script is not None
    print(f"submitted job {job.id}")
    print(f"  script: {job.script}")
    print(f"  output: {_expand(job.spec.output, job.spec.name, job.id)}")
    if job.spec.error:
        print(f"  error:  {_expand(job.spec.error, job.spec.name, job.id)}")
    print(f"  follow: torchslurm logs {job.id} -f")
    return 0


def make_log_dirs(spec: JobSpec) -> None:
    """Create the directories of absolute log patterns (relative ones go into the run directory,
    which job.submit creates): Slurm does not, and without them the job fails before printing
    anything. Created rather than refused, as `mkdir -p` is what the user would do next."""
    for key, path in log_dirs(spec, Path("/")).items():
        if not Path(getattr(spec, key)).is_absolute():
            continue
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--{key}={getattr(spec, key)}: cannot create {path}/ ({exc.strerror}); Slurm does "
                              "not create it and the job would fail before printing anything. HINT: give a "
                              f"directory you can write, e.g. --{key} logs/%x-%j.out (placed in the run "
                              "directory).") from exc


def _expand(pattern: str, name: str, job_id: str) -> str:
    """The common Slurm filename patterns (%x, %j, %%); others are left for Slurm."""
    return pattern.replace("%%", "\0").replace("%x", name).replace("%j", job_id).replace("\0", "%")
