"""docs/sweeps.md's results table and plot are real: a 3x2 sweep of the built-in digits example is
trained here, then `torchslurm results` reads it, and the page must show what it printed.

No Slurm: each point is trained by the program every rank of `torchslurm train` runs (`rank_main`),
one process per point's run, all six in one interpreter (torch imported once), with the point's
overrides and `run_dir=<sweep_dir>/<point dir>` exactly as the sweep's array script passes them, in
a sweep folder whose sweep.json lists the points (never submitted: Slurm is not asked). One thread
per process, so that the numbers do not depend on the machine's core count, and the CPU kernels of
ATen, MKL and oneDNN held to AVX2, so that they do not depend on its instruction set: on an AVX-512
machine (a Zen 4 here) the lr=0.2 points, whose training amplifies the last bits, ended elsewhere.

The train_time_s column is a measurement and is not compared. After a change that moves the
numbers (the Trainer, the example, this sweep), regenerate the page's table and plot and review
the diff:  TORCHSLURM_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/docs/test_sweeps_page.py
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from torchslurm.jobs.results import TIME_COLUMN
from torchslurm.jobs.sweep import point_dir
from torchslurm.jobs.sweepstate import Manifest, Point, write_manifest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "sweeps.md"
PLOT = ROOT / "docs" / "sweeps-results.png"
TABLE = re.compile(r"(<!-- results table: begin -->\n)(.*?)(<!-- results table: end -->)", re.S)
GRID = {"lr": [0.02, 0.05, 0.2], "batch_size": [64, 128]}
SETTINGS = ["epochs=2", "log_every=0"]  # the spec's args: every point's
RESULTS = ["--sort", "best_val_accuracy", "--desc", "--format", "md"]
"""The command the page shows, after `torchslurm results DIR`."""
SAME_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
"""The widest instruction set every x86 machine this project ran on has (each variable caps one library)."""
TRAIN_POINTS = """
import json, sys
from torchslurm.cli.train import rank_main
for argv in json.loads(sys.argv[1]):
    if rank_main(argv) != 0:
        sys.exit(f"point {argv} failed")
"""


def _environ() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    return {**env, **SAME_KERNELS, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}


def _sweep(sweep_dir: Path) -> Manifest:
    """The grid's points, keys in the order written, named `<i>-<key=value,...>` as a sweep names them."""
    grids = (dict(zip(GRID, values, strict=True)) for values in itertools.product(*GRID.values()))
    points = tuple(Point(i, point_dir(i, overrides), overrides) for i, overrides in enumerate(grids))
    sweep_dir.mkdir(parents=True)
    manifest = Manifest("digits", sweep_dir, points)
    write_manifest(manifest)
    return manifest


def _masked(table: str) -> list[list[str]]:
    """The Markdown table's cells, the measured column's blanked."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in table.strip().splitlines()]
    column = rows[0].index(TIME_COLUMN)
    return [[*row[:column], "(measured)", *row[column + 1:]] if i > 1 else row for i, row in enumerate(rows)]


def test_the_sweeps_page_shows_what_results_prints_for_a_real_sweep(tmp_path: Path) -> None:
    manifest = _sweep(tmp_path / "runs" / "digits")
    argv = [[*SETTINGS, *(f"{k}={v}" for k, v in p.overrides.items()), f"run_dir={manifest.run_dir(p)}"]
            for p in manifest.points]
    trained = subprocess.run([sys.executable, "-c", TRAIN_POINTS, json.dumps(argv)], cwd=tmp_path, env=_environ(),
                             capture_output=True, text=True, timeout=300, check=False)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    shown = subprocess.run([sys.executable, "-m", "torchslurm", "results", "runs/digits", *RESULTS, "--plot",
                            "best_val_accuracy", "--x", "lr", "--plot-file", "plot.png"], cwd=tmp_path,
                           env=_environ(), capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr
    assert (tmp_path / "plot.png").read_bytes().startswith(b"\x89PNG")
    page = PAGE.read_text()
    if os.environ.get("TORCHSLURM_REGEN_GOLDEN") == "1":
        PAGE.write_text(TABLE.sub(lambda m: m.group(1) + shown.stdout + m.group(3), page))
        PLOT.write_bytes((tmp_path / "plot.png").read_bytes())
        page = PAGE.read_text()
    found = TABLE.search(page)
    assert found is not None, f"{PAGE} has no results table between its markers"
    assert _masked(found.group(2)) == _masked(shown.stdout), (
        f"{PAGE}'s table is not what `torchslurm results` printed:\n{shown.stdout}\nregenerate it: "
        "TORCHSLURM_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/docs/test_sweeps_page.py")
    assert f"torchslurm results runs/digits {' '.join(RESULTS)}" in page  # the page shows the command it ran
    assert PLOT.read_bytes().startswith(b"\x89PNG")
