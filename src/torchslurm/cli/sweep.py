"""`torchslurm sweep [spec flags] [--grid K=V1,V2]... [--point K=V,K=V]... SCRIPT ARGS...`: one job
array, task i running point i of the sweep in a run_dir of its own; run again, it submits only the
points that have not completed and are not queued (docs/sweeps.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from torchslurm.cli.sandbox import hint_sandbox
from torchslurm.cli.script import add_spec_arguments, report, spec_from_args

if TYPE_CHECKING:
    from torchslurm.jobs.asked import Asked
    from torchslurm.jobs.slurm import SlurmClient
    from torchslurm.jobs.spec import JobSpec
    from torchslurm.jobs.sweep import Sweep, Validator
    from torchslurm.jobs.sweepstate import Manifest, Point, PointState


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sweep", help="run a grid of settings as one job array; again, resubmit only what did not complete",
        description="A job spec (the flags and --spec file of `submit`) with a sweep: a grid (--grid, cartesian "
        "product), explicit points (--point) or both (the grid's points first). Every point's settings are checked "
        "before anything is submitted. One job array: task i runs the script with point i's key=value settings "
        "after its args and run_dir=<sweep dir>/<i>-<key=value,...>, where <sweep dir> is <--sweep-dir>/<sweep "
        "name>; sweep.json there lists the points and submissions. Run the same command again to submit, as one "
        "array, the points that neither completed nor are pending or running.")
    add_spec_arguments(parser)
    group = parser.add_argument_group("the sweep (override the --spec file's sweep: section)")
    group.add_argument("--grid", action="append", metavar="KEY=V1,V2,...",
                       help="a swept setting and its values (repeatable; replaces that key of the file's grid)")
    group.add_argument("--point", action="append", metavar="KEY=V,KEY=V",
                       help="an explicit point (repeatable; replaces the file's points)")
    group.add_argument("--max-parallel", type=int, default=None, metavar="N",
                       help="at most N tasks of the array run at once (Slurm's --array=...%%N)")
    group.add_argument("--sweep-name", default=None, metavar="NAME", help="the sweep's name (default: the job's)")
    group.add_argument("--sweep-dir", type=Path, default=None, metavar="DIR",
                       help="the folder the sweep's folder <DIR>/<NAME> goes into (default: runs)")
    group.add_argument("--dry-run", action="store_true",
                       help="print the array's script and the table of points; submit nothing, write nothing")
    parser.set_defaults(handler=hint_sandbox(handle))


def handle(args: argparse.Namespace) -> int:
    from torchslurm.jobs import sweep as sweeps
    from torchslurm.jobs.asked import bash_syntax, findings
    from torchslurm.jobs.findings import by_severity
    from torchslurm.jobs.slurm import SlurmClient
    from torchslurm.jobs.submit import never_starts, placed
    from torchslurm.jobs.sweepscript import array_spec, render_array
    from torchslurm.jobs.sweepstate import point_states, read_manifest, read_outcomes, slurm_tasks, to_resubmit

    asked, sweep, points = _sweep_of(args)
    client = SlurmClient()
    version = args.slurm_version or (client.version() if asked.spec.gpus_per_node and not args.dry_run else None)
    found = findings(asked, version, Path.cwd(), submitting=not args.dry_run)
    if not args.dry_run:
        found += never_starts(asked.spec, client, asked.spelling)
    old = read_manifest(sweep.sweep_dir)
    if old is not None and (differ := sweeps.same_points(old, points)):
        raise differ
    manifest = old or sweeps.manifest(sweep, points)  # run again: Slurm and each run_dir say what is left to do
    states = point_states(manifest, read_outcomes(manifest), slurm_tasks(manifest, client)) \
        if manifest.submissions else None
    chosen = to_resubmit(states) if states is not None else [p.index for p in points]
    if not chosen:
        print(f"sweep {sweep.name}: all {len(points)} points are completed, pending or running; nothing to submit")
        _print_table(sweeps.table(manifest, states, chosen))
        return 0
    spec = placed(array_spec(asked.spec, sweep, chosen), manifest.sweep_dir)
    text = render_array(spec, sweep, [manifest.points[i] for i in chosen])
    code = report(by_severity([*found, *bash_syntax(text)]), args.force)
    if code:
        return code
    if args.dry_run:
        sys.stdout.write(text)
        print(f"\n# sweep {sweep.name} in {manifest.sweep_dir}: {len(chosen)} of {len(points)} points to submit")
        _print_table(sweeps.table(manifest, states, chosen))
        return 0
    return _submit(asked.spec, sweep, manifest, chosen, states, client)


def _sweep_of(args: argparse.Namespace) -> tuple[Asked, Sweep, list[Point]]:
    """The job spec (the --spec file without its sweep: section, and the flags), the sweep (that
    section and the sweep flags) and its points, every point checked."""
    from torchslurm.configfile import read_mapping
    from torchslurm.jobs import spec as jobspec
    from torchslurm.jobs import sweep as sweeps

    from_file = read_mapping(args.spec, f"job spec {args.spec}", [*jobspec.field_names(), "sweep"]) \
        if args.spec is not None else {}
    asked = spec_from_args(args, {k: v for k, v in from_file.items() if k != "sweep"})
    flags = {"grid": dict(sweeps.parse_grid_flag(g) for g in args.grid or []), "name": args.sweep_name,
             "points": [sweeps.parse_point_flag(p) for p in args.point] if args.point else None,
             "max_parallel": args.max_parallel, "run_dir": args.sweep_dir}
    sweep = sweeps.section(from_file.get("sweep"), asked.spec, flags)
    points = sweeps.expand(sweep)
    sweeps.check(asked.spec, sweep, points, settings_check(asked.spec.args))
    return asked, sweep, points


def _submit(spec: JobSpec, sweep: Sweep, manifest: Manifest, chosen: list[int], states: list[PointState] | None,
            client: SlurmClient) -> int:
    from torchslurm.jobs import sweep as sweeps
    from torchslurm.jobs.submit import expand_pattern, placed
    from torchslurm.jobs.sweepscript import array_spec, submit_array

    done, submission = submit_array(spec, sweep, manifest, chosen, client)
    used = placed(array_spec(spec, sweep, chosen), done.sweep_dir)
    print(f"submitted sweep {sweep.name}: job {submission.job_id}, array {used.array} "
          f"({len(chosen)} of {len(manifest.points)} points)")
    _print_table(sweeps.table(done, states, chosen))
    print(f"  folder:  {done.sweep_dir} (sweep.json lists the points and submissions)")
    print(f"  script:  {submission.script}")
    print(f"  logs:    {expand_pattern(used.output, {'x': spec.name, 'A': submission.job_id})}  (%a: the point)")
    print(f"  results: torchslurm results {done.sweep_dir}; run this command again to resubmit what failed")
    return 0


def settings_check(spec_args: Sequence[str]) -> Validator:
    """The check of a point's settings: train.config's, the spec's own `key=value` args first (those
    of train.config's keys), so that a point is checked as the script will read it."""
    from torchslurm.configfile import unknown_keys_error
    from torchslurm.errors import ConfigError
    from torchslurm.train import config

    keys = config.valid_keys()
    base = [a for a in spec_args if not a.startswith("-") and a.partition("=")[0].strip().replace("-", "_") in keys]

    def validate(settings: Sequence[str]) -> None:
        unknown = [s.partition("=")[0] for s in settings if s.partition("=")[0].replace("-", "_") not in keys]
        if unknown:
            said = unknown_keys_error("its settings", unknown, keys)
            raise ConfigError(said.message, f"{said.hint} An argument of your script's own: list it in the "
                              "sweep: section's extra_keys (passed on, not checked).")
        config.build(config.parse_overrides([*base, *settings]), "its settings")

    return validate


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
