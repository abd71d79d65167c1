"""A sweep's job array: its sbatch script and its submission (docs/sweeps.md).

The script is `sbatch.render`'s, with `--array=<indices>%<max_parallel>` and a `case` on
SLURM_ARRAY_TASK_ID that picks the task's point: array task i runs point i, its overrides and its
run_dir passed after the spec's args. Every word is shell-quoted and the script reads no file at run
time, so a point runs as `--dry-run` printed it. Everything else (preemption, requeue, the job's
secret) is any torchslurm job's: a requeue names the task (`scontrol requeue ARRAYJOB_TASK`,
train.requeue), so only that task comes back.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Sequence

from torchslurm.jobs.sbatch import render
from torchslurm.jobs.slurm import SlurmClient
from torchslurm.jobs.spec import JobSpec
from torchslurm.jobs.submit import prepare
from torchslurm.jobs.sweep import ARRAY_OUTPUT, Sweep, point_args
from torchslurm.jobs.sweepstate import Manifest, Point, Submission, write_manifest

SWEEP_VARIABLE = "TORCHSLURM_SWEEP"
"""The sweep's name in every rank's environment (trackers group a sweep's runs by it)."""
POINT_VARIABLE = "TORCHSLURM_SWEEP_POINT"
"""The point's folder name (`<index>-<k=v,...>`) in every rank's environment."""
_ARGS = "point_args"
_DEFAULT_OUTPUT = next(f.default for f in dataclasses.fields(JobSpec) if f.name == "output")


def array_range(indices: Sequence[int], max_parallel: int | None) -> str:
    """`--array`'s value: runs of consecutive indices as ranges (`0-3,5,7-8`), then `%N`."""
    ordered = sorted(set(indices))
    assert ordered, "an array needs at least one task"
    runs: list[list[int]] = []
    for index in ordered:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    text = ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return f"{text}%{max_parallel}" if max_parallel else text


def array_spec(spec: JobSpec, sweep: Sweep, indices: Sequence[int]) -> JobSpec:
    """`spec` as the array job: its `--array`, and the tasks' logs named by array job and task id
    (`%x-%A_%a.out`) unless the spec names them."""
    output = ARRAY_OUTPUT if spec.output == _DEFAULT_OUTPUT else spec.output
    return dataclasses.replace(spec, array=array_range(indices, sweep.max_parallel), output=output)


def case_block(sweep: Sweep, points: Sequence[Point]) -> list[str]:
    """The lines that pick the task's point: its args in an array, its folder's name exported."""
    lines = [f"# sweep {sweep.name}: array task i runs point i in {sweep.sweep_dir}/<point> (sweep.json lists them)",
             'case "${SLURM_ARRAY_TASK_ID:-}" in']
    for point in points:
        words = " ".join(shlex.quote(a) for a in point_args(sweep, point))
        lines.append(f"  {point.index}) point={shlex.quote(point.dir)}; {_ARGS}=({words}) ;;")
    missing = shlex.quote(f"torchslurm sweep {sweep.name}: this script runs array tasks "
                          f"{array_range([p.index for p in points], None)}, not task ")
    lines += [f'  *) echo {missing}"${{SLURM_ARRAY_TASK_ID:-(none)}}" >&2; exit 2 ;;', "esac",
              f'export {SWEEP_VARIABLE}={shlex.quote(sweep.name)} {POINT_VARIABLE}="$point"']
    return lines


def render_array(spec: JobSpec, sweep: Sweep, points: Sequence[Point]) -> str:
    """The sbatch script of the array that runs `points` (task ids = their indices). `spec` is the
    array's (array_spec)."""
    return render(spec, case_block(sweep, points), f'"${{{_ARGS}[@]}}"')


def submit_array(spec: JobSpec, sweep: Sweep, manifest: Manifest, indices: Sequence[int], client: SlurmClient,
                 clock: Callable[[], float] = time.time) -> tuple[Manifest, Submission]:
    """Write the array's script into the sweep's folder (`<name>.sbatch`, `-2`, ... one per
    submission), sbatch it, and record the submission in sweep.json (written whole): the new
    manifest and the submission. Relative log patterns go into the sweep's folder."""
    chosen = [manifest.points[i] for i in sorted(set(indices))]
    manifest.sweep_dir.mkdir(parents=True, exist_ok=True)
    _, script = prepare(array_spec(spec, sweep, indices), manifest.sweep_dir,
                        lambda s: render_array(s, sweep, chosen))
    job_id = client.submit(script)
    submission = Submission(job_id, tuple(p.index for p in chosen), clock(), str(script))
    done = manifest.submitted(submission)
    write_manifest(done)
    return done, submission

