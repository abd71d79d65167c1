"""`torchslurm results DIR`: a sweep's points (or a folder's runs) as one table, sorted, in the
format asked for, and with --plot a PNG of a metric against a swept key and every validation curve."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torchslurm.jobs.table import FORMATS


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "results", help="a sweep's points (or a folder of run_dirs) as one table; --plot draws a metric",
        description="One row per point of a sweep (DIR holds sweep.json), or per run_dir of a folder (a folder "
        "holding metrics.jsonl): its swept settings, its state (completed, running, pending, failed with the "
        "reason, not started, unknown), epochs done, best and final validation metrics, and train_time_s (the "
        "sum of its epochs' epoch_time_s). A sweep's states ask Slurm (scontrol) and fall back to each run's "
        "outcome.json where Slurm cannot answer. Works while the sweep runs.")
    parser.add_argument("directory", type=Path, metavar="DIR", help="a sweep's folder, a run_dir or a folder of them")
    parser.add_argument("--sort", default=None, metavar="COL", help="order the rows by this column (numbers "
                        "numerically; rows without a value last); default: as the sweep lists its points")
    parser.add_argument("--desc", action="store_true", help="largest first")
    parser.add_argument("--format", default="table", choices=FORMATS, help="table (default), csv, json or md")
    parser.add_argument("--plot", default=None, metavar="METRIC", help="draw this numeric column (e.g. "
                        "best_val_accuracy) against a swept key, beside every run's validation curve, into a PNG")
    parser.add_argument("--x", default=None, metavar="KEY", help="the swept key along x (default: the first "
                        "that varies); the other keys that vary draw one line each")
    parser.add_argument("--plot-file", type=Path, default=None, metavar="PATH",
                        help="where the PNG goes (default: DIR/results-METRIC.png)")
    parser.add_argument("--no-slurm", action="store_true", help="do not ask Slurm: states from outcome.json alone")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from torchslurm.jobs.results import collect
    from torchslurm.jobs.slurm import SlurmClient
    from torchslurm.jobs.table import Row, check_column, render, sort_rows

    results = collect(args.directory, None if args.no_slurm else SlurmClient())
    columns = results.columns()
    rows: list[Row] = list(results.rows())
    if args.sort is not None:
        rows = sort_rows(rows, check_column(args.sort, columns), descending=args.desc)
    elif args.desc:
        rows.reverse()
    if args.plot is not None:
        from torchslurm.jobs.resultsplot import check, plot

        check(results, args.plot, args.x)  # before the table is printed: a typo is told first and alone
    shown = columns if args.format in ("table", "md") else [*columns, "run_dir"]
    sys.stdout.write(render(rows, shown, args.format, exact=results.keys))
    aside = sys.stdout if args.format == "table" else sys.stderr  # csv, json and md stay clean for a pipe
    for note in results.notes:
        print(f"note: {note}", file=aside)
    if args.plot is not None:
        path = plot(results, args.plot, args.x, args.plot_file or args.directory / f"results-{args.plot}.png")
        print(f"plot: {path}", file=aside)
    return 0
