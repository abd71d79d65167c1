"""Rows sorted and written as a text table, CSV, JSON and Markdown."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from torchslurm.errors import ConfigError
from torchslurm.jobs.table import Row, check_column, render, sort_rows, text_cell

ROWS: list[Row] = [
    {"point": 0, "lr": 0.001, "state": "completed", "loss": 0.5},
    {"point": 1, "lr": 0.01, "state": "failed", "loss": None},
    {"point": 2, "lr": 0.0003, "state": "running", "loss": 10.25},
    {"point": 3, "lr": 0.1, "state": "completed", "loss": 2.0},
    {"point": 4, "lr": 0.03, "state": "not started", "loss": math.nan},
]


def _order(rows: list[Row]) -> list[object]:
    return [r["point"] for r in rows]


def test_numbers_sort_numerically_and_missing_values_go_last_either_way() -> None:
    assert _order(sort_rows(ROWS, "loss")) == [0, 3, 2, 1, 4]  # as text "10.25" would come before "2.0"
    assert _order(sort_rows(ROWS, "loss", descending=True)) == [2, 3, 0, 1, 4]
    assert _order(sort_rows(ROWS, "lr")) == [2, 0, 1, 4, 3]


def test_text_sorts_as_text_after_numbers_and_equal_cells_keep_their_order() -> None:
    assert _order(sort_rows(ROWS, "state")) == [0, 3, 1, 4, 2]
    mixed: list[Row] = [{"point": 0, "x": "b"}, {"point": 1, "x": 3}, {"point": 2, "x": "a"}, {"point": 3}]
    assert _order(sort_rows(mixed, "x")) == [1, 2, 0, 3]


def test_an_unknown_column_names_the_nearest_and_every_column() -> None:
    with pytest.raises(ConfigError) as err:
        check_column("los", ["point", "lr", "loss"])
    assert err.value.message == "--sort 'los' is not a column of these results."
    assert err.value.hint == "did you mean --sort loss? the columns are: point, lr, loss."
    assert check_column("lr", ["point", "lr"]) == "lr"


def test_cells_show_four_significant_digits_unless_exact() -> None:
    assert [text_cell(c) for c in (0.123456, 12345.6, 3, None, "", True, math.nan)] == [
        "0.1235", "1.235e+04", "3", "-", "-", "true", "nan"]
    assert text_cell(0.000123456, exact=True) == "0.000123456"  # a learning rate is shown as it was given


def test_the_text_table_aligns_numbers_right_and_text_left() -> None:
    out = render(ROWS[:3], ["point", "state", "loss"], "table")
    assert out == ("point  state       loss\n"
                   "    0  completed    0.5\n"
                   "    1  failed         -\n"
                   "    2  running    10.25\n")


def test_csv_quotes_what_needs_it_and_keeps_every_digit() -> None:
    rows: list[Row] = [{"reason": 'rank 0: "boom", then\nmore', "loss": 0.1 + 0.2, "n": None, "ok": False}]
    out = render(rows, ["reason", "loss", "n", "ok"], "csv")
    assert list(csv.reader(io.StringIO(out))) == [["reason", "loss", "n", "ok"],
                                                  ['rank 0: "boom", then\nmore', "0.30000000000000004", "", "false"]]


def test_json_is_valid_json_with_null_for_what_is_not_a_number() -> None:
    out = render(ROWS, ["point", "loss"], "json")
    assert json.loads(out) == [{"point": 0, "loss": 0.5}, {"point": 1, "loss": None}, {"point": 2, "loss": 10.25},
                               {"point": 3, "loss": 2.0}, {"point": 4, "loss": None}]
    assert json.loads(render([{"x": math.inf}], ["x"], "json")) == [{"x": None}]


def test_markdown_escapes_pipes_and_aligns_numeric_columns_right() -> None:
    rows: list[Row] = [{"run": "a|b", "loss": 0.25, "reason": "line\nbreak"}]
    assert render(rows, ["run", "loss", "reason"], "md") == ("| run | loss | reason |\n"
                                                            "|---|---:|---|\n"
                                                            "| a\\|b | 0.25 | line break |\n")


def test_an_unknown_format_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"--format='html' is not one of table, csv, json, md"):
        render(ROWS, ["point"], "html")


WHOLE_ROWS: list[Row] = [
    {"run": "a\nb", "lr": 0.000123456, "opt": "Adam", "ok": True, "loss": math.nan},
    {"run": "c|d", "lr": 1e-5, "opt": None, "ok": False, "loss": 0.25}]
WHOLE_COLUMNS = ["run", "lr", "opt", "ok", "loss"]


@pytest.mark.parametrize(("form", "text"), [
    ("table", "run           lr  opt   ok     loss\na b  0.000123456  Adam  true    nan\n"
              "c|d        1e-05  -     false  0.25\n"),
    ("csv", 'run,lr,opt,ok,loss\n"a\nb",0.000123456,Adam,true,nan\nc|d,1e-05,,false,0.25\n'),
    ("json", '[\n {\n  "run": "a\\nb",\n  "lr": 0.000123456,\n  "opt": "Adam",\n  "ok": true,\n  "loss": null\n },\n'
             ' {\n  "run": "c|d",\n  "lr": 1e-05,\n  "opt": null,\n  "ok": false,\n  "loss": 0.25\n }\n]\n'),
    ("md", "| run | lr | opt | ok | loss |\n|---|---:|---|---|---:|\n| a b | 0.000123456 | Adam | true | nan |\n"
           "| c\\|d | 1e-05 | - | false | 0.25 |\n"),
])
def test_every_format_whole_with_an_exact_column(form: str, text: str) -> None:
    assert render(WHOLE_ROWS, WHOLE_COLUMNS, form, exact={"lr"}) == text


def test_an_empty_cell_sorts_last_as_a_missing_one() -> None:
    rows: list[Row] = [{"k": ""}, {"k": "b"}, {"k": None}, {"k": "a"}]
    assert [r["k"] for r in sort_rows(rows, "k")] == ["a", "b", "", None]


def test_an_unknown_column_with_nothing_near_lists_the_columns_alone() -> None:
    with pytest.raises(ConfigError) as refused:
        check_column("zzz", ["loss", "state"], what="--by")
    assert (refused.value.message, refused.value.hint) == (
        "--by 'zzz' is not a column of these results.", "the columns are: loss, state.")
