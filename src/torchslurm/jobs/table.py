"""Rows of named cells sorted and written as a text table, CSV, JSON or a Markdown table: pure.

A row is a mapping from column name to a cell: a number, a string, or None (nothing known). The
formats agree on what a cell is and differ only in how it is written: the text and Markdown tables
show numbers to 4 significant digits (except the `exact` columns, shown as given: a learning rate
is not rounded), CSV and JSON keep every digit; an unknown cell is `-` in the tables, empty in CSV
and null in JSON, as is a number that is not finite in JSON (which has no NaN).
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import math
from collections.abc import Collection, Mapping, Sequence

from torchslurm.errors import ConfigError, not_one_of

Cell = str | int | float | bool | None
Row = Mapping[str, Cell]
FORMATS = ("table", "csv", "json", "md")
MISSING = "-"


def _number(cell: Cell) -> float | None:
    """A present cell (see `_present`: not NaN) as a number to sort by; None for text."""
    if isinstance(cell, bool) or not isinstance(cell, int | float):
        return None
    return float(cell)


def sort_rows(rows: Sequence[Row], column: str, descending: bool = False) -> list[Row]:
    """Rows ordered by `column`: numbers numerically, before text (ordered as text); a row with
    nothing there (None, NaN, no such cell) goes last in either direction. Stable: equal cells keep
    their order."""
    def key(row: Row) -> tuple[int, float, str]:
        cell = row.get(column)
        number = _number(cell)
        return (0, number, "") if number is not None else (1, 0.0, str(cell))

    present = [r for r in rows if _present(r.get(column))]
    missing = [r for r in rows if not _present(r.get(column))]
    return sorted(present, key=key, reverse=descending) + missing


def _present(cell: Cell) -> bool:
    return cell is not None and cell != "" and not (isinstance(cell, float) and math.isnan(cell))


def check_column(column: str, columns: Sequence[str], what: str = "--sort") -> str:
    """`column` if it is one of `columns`, else a ConfigError naming the choices (and the nearest)."""
    if column in columns:
        return column
    close = difflib.get_close_matches(column, list(columns), n=1)
    hint = (f"did you mean {what} {close[0]}? " if close else "") + f"the columns are: {', '.join(columns)}."
    raise ConfigError(f"{what} {column!r} is not a column of these results.", hint)


def text_cell(cell: Cell, exact: bool = False) -> str:
    """A cell as the text and Markdown tables show it."""
    if cell is None or cell == "":
        return MISSING
    if isinstance(cell, bool):
        return str(cell).lower()
    if isinstance(cell, float) and not exact:
        return f"{cell:.4g}"
    return str(cell)


def render(rows: Sequence[Row], columns: Sequence[str], form: str, exact: Collection[str] = ()) -> str:
    """The rows' `columns` in one of FORMATS, ending in a newline."""
    writers = {"table": _table, "csv": _csv, "json": _json, "md": _markdown}
    if form not in writers:
        raise not_one_of("--format", form, FORMATS)
    return writers[form](rows, columns, exact)


def _numeric(rows: Sequence[Row], column: str) -> bool:
    cells = [r.get(column) for r in rows if _present(r.get(column))]
    return bool(cells) and all(_number(c) is not None for c in cells)


def _table(rows: Sequence[Row], columns: Sequence[str], exact: Collection[str]) -> str:
    """Columns padded to their widest cell, numbers right-aligned; the last column is not padded."""
    cells = [[text_cell(r.get(c), c in exact).replace("\n", " ") for c in columns] for r in rows]
    widths = [max([len(c), *(len(line[i]) for line in cells)]) for i, c in enumerate(columns)]
    right = [_numeric(rows, c) for c in columns]

    def line(values: Sequence[str]) -> str:
        padded = [v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)]
        return "  ".join(padded).rstrip()

    return "\n".join([line(list(columns)), *(line(c) for c in cells)]) + "\n"


def _markdown(rows: Sequence[Row], columns: Sequence[str], exact: Collection[str]) -> str:
    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|").replace("\n", " ") for v in values) + " |"

    rule = ["---:" if _numeric(rows, c) else "---" for c in columns]
    body = [line([text_cell(r.get(c), c in exact) for c in columns]) for r in rows]
    return "\n".join([line(list(columns)), "|" + "|".join(rule) + "|", *body]) + "\n"


def _csv(rows: Sequence[Row], columns: Sequence[str], exact: Collection[str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else _csv_cell(row.get(c)) for c in columns])
    return out.getvalue()


def _csv_cell(cell: Cell) -> str:
    return str(cell).lower() if isinstance(cell, bool) else str(cell)  # a float's str() keeps every digit


def _json(rows: Sequence[Row], columns: Sequence[str], exact: Collection[str]) -> str:
    def plain(cell: Cell) -> Cell:
        return None if isinstance(cell, float) and not math.isfinite(cell) else cell

    return json.dumps([{c: plain(r.get(c)) for c in columns} for r in rows], indent=1) + "\n"
