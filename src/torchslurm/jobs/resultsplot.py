"""`torchslurm results --plot METRIC`: one PNG, two panels. Left: the metric (a numeric column of
the table) against a swept key, one line per combination of the other keys that vary. Right: the
validation curve of every run, epoch by epoch.

matplotlib is imported here only, when a plot is asked for (`results` without --plot needs none),
and through its object API, which keeps no global state.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from torchslurm.errors import ConfigError
from torchslurm.jobs.results import Results
from torchslurm.jobs.table import Cell, Row, check_column, text_cell
from torchslurm.runtime.safefiles import replace

if TYPE_CHECKING:
    from matplotlib.axes import Axes

LOG_SCALE_RATIO = 10.0
"""A positive numeric key whose largest value is this many times its smallest is drawn on a log axis (lr)."""
LEGEND_MAX = 12
"""More curves than this get no legend: it would hide the plot."""


def numeric_columns(results: Results, rows: Sequence[Row]) -> list[str]:
    """The columns with a number in some row (the metrics, epochs, times, numeric keys)."""
    return [c for c in results.columns() if c != results.name_column and any(
        isinstance(r.get(c), int | float) and not isinstance(r.get(c), bool) for r in rows)]


def x_key(results: Results, x: str | None) -> str:
    """The key to draw along x: `x`, else the first swept key with two values or more, else the
    run's name."""
    if x is not None:
        if x in results.keys:
            return x
        raise ConfigError(f"--x {x!r} is not a swept key of {results.directory}.",
                          f"use one of: {', '.join(results.keys)}." if results.keys else
                          "these runs have no swept keys; leave --x out to draw the runs by name.")
    rows = results.rows()
    for key in results.keys:
        if len({text_cell(r.get(key), exact=True) for r in rows}) > 1:
            return key
    return results.keys[0] if results.keys else results.name_column


def curve_metric(results: Results, metric: str) -> str | None:
    """The validation metric whose curves the right panel draws: the one `metric` is made of
    (best_val_accuracy -> accuracy), else loss, else the first there is."""
    names = results.metric_names()
    for prefix in ("best_val_", "final_val_"):
        if metric.startswith(prefix) and metric[len(prefix):] in names:
            return metric[len(prefix):]
    return "loss" if "loss" in names else (names[0] if names else None)


def check(results: Results, metric: str, x: str | None) -> str:
    """The key along x, once `metric` is known to be a numeric column (a ConfigError if not)."""
    numeric = numeric_columns(results, results.rows())
    if metric in results.columns() and metric not in numeric:
        raise ConfigError(f"--plot {metric!r} has no number to draw in any row.",
                          f"draw one of: {', '.join(numeric) or '(none yet: no run has written metrics)'}.")
    check_column(metric, numeric, "--plot")
    return x_key(results, x)


def plot(results: Results, metric: str, x: str | None, path: Path) -> Path:
    """Draw `metric` against `x` and every run's validation curve into `path` (a PNG); `path`."""
    key = check(results, metric, x)
    rows = results.rows()
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(11, 4))
    ax_metric, ax_curves = fig.subplots(1, 2)
    title = f"sweep {results.sweep}" if results.sweep is not None else str(results.directory.name)
    fig.suptitle(f"{title}: {len(rows)} run(s)")
    _draw_metric(ax_metric, results, rows, metric, key)
    name = curve_metric(results, metric)
    if name is not None:
        for point, row in zip(results.points, rows, strict=True):
            curve = point.metrics.curve(name)
            if curve:
                ax_curves.plot([e for e, _ in curve], [v for _, v in curve], marker=".", label=_label(results, row))
        ax_curves.set(title=f"val_{name} per epoch", xlabel="epoch", ylabel=f"val_{name}")
        ax_curves.xaxis.set_major_locator(MaxNLocator(integer=True))
        if 0 < len(ax_curves.lines) <= LEGEND_MAX:
            ax_curves.legend(fontsize="small")
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=72)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace(path, image.getvalue())
    return path


def _label(results: Results, row: Row) -> str:
    """`3: lr=0.1,seed=2` for a sweep's point; a run's folder name (which holds its settings if any)."""
    if results.sweep is None:
        return str(row.get(results.name_column))
    settings = ",".join(f"{k}={text_cell(row.get(k), exact=True)}" for k in results.keys)
    return f"{row.get(results.name_column)}: {settings}" if settings else str(row.get(results.name_column))


def _number(cell: Cell) -> float | None:
    if isinstance(cell, bool) or not isinstance(cell, int | float) or not math.isfinite(cell):
        return None
    return float(cell)


def _draw_metric(ax: Axes, results: Results, rows: Sequence[Row], metric: str, key: str) -> None:
    """One line per combination of the other keys that vary; x numeric where every value is a number."""
    others = [k for k in results.keys if k != key and len({text_cell(r.get(k), exact=True) for r in rows}) > 1]
    numeric_x = all(_number(r.get(key)) is not None for r in rows)
    places = {v: i for i, v in enumerate(dict.fromkeys(text_cell(r.get(key), exact=True) for r in rows))}
    groups: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        y = _number(row.get(metric))
        if y is None:
            continue  # not started, diverged, no such metric yet
        xv = _number(row.get(key)) if numeric_x else float(places[text_cell(row.get(key), exact=True)])
        label = ", ".join(f"{k}={text_cell(row.get(k), exact=True)}" for k in others)
        groups.setdefault(label, []).append((xv if xv is not None else 0.0, y))
    for label, pairs in groups.items():
        pairs.sort()
        style = "" if key == results.name_column else "-"  # runs by name: points, no line between them
        ax.plot([p[0] for p in pairs], [p[1] for p in pairs], marker="o", linestyle=style, label=label or None)
    xs = [_number(r.get(key)) or 0.0 for r in rows] if numeric_x else []
    if xs and min(xs) > 0 and max(xs) >= LOG_SCALE_RATIO * min(xs):
        ax.set_xscale("log")
    if not numeric_x or len(places) <= LEGEND_MAX:  # ticks at the values swept, written as given
        ticks = {float(i): text for text, i in places.items()} if not numeric_x else {
            _number(r.get(key)) or 0.0: text_cell(r.get(key), exact=True) for r in reversed(rows)}
        ax.minorticks_off()
        ax.set_xticks(list(ticks), list(ticks.values()), rotation=30 if len(ticks) > 4 else 0)
    ax.set(title=f"{metric} by {key}", xlabel=key, ylabel=metric)
    if others:
        ax.legend(fontsize="small")
