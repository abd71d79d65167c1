"""A sweep's section, points, names and checks (jobs.sweep); each point's Trainer settings are
checked with the CLI's check (train.config), as `torchslurm sweep` does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchslurm.cli.sweep import settings_check
from torchslurm.errors import ConfigError
from torchslurm.jobs.spec import JobSpec
from torchslurm.jobs.sweep import (
    MAX_DIR_CHARS,
    Sweep,
    check,
    expand,
    flag_value,
    parse_grid_flag,
    parse_point_flag,
    point_args,
    point_dir,
    same_points,
    section,
)
from torchslurm.jobs.sweepstate import Manifest

SPEC = JobSpec(script="train.py", args=("epochs=2",))


def points_of(data: dict[str, Any], flags: dict[str, Any] | None = None) -> list[tuple[str, dict[str, Any]]]:
    return [(p.dir, dict(p.overrides)) for p in expand(section(data, SPEC, flags))]


def test_the_grid_is_a_cartesian_product_in_the_order_written_then_the_points() -> None:
    assert points_of({"grid": {"lr": [0.001, 0.0003], "seed": [0, 1]}, "points": [{"lr": 0.01, "seed": 7}]}) == [
        ("0-lr=0.001,seed=0", {"lr": 0.001, "seed": 0}), ("1-lr=0.001,seed=1", {"lr": 0.001, "seed": 1}),
        ("2-lr=0.0003,seed=0", {"lr": 0.0003, "seed": 0}), ("3-lr=0.0003,seed=1", {"lr": 0.0003, "seed": 1}),
        ("4-lr=0.01,seed=7", {"lr": 0.01, "seed": 7})]
    assert points_of({"grid": {"seed": [1, 0], "lr": 0.1}}) == [  # a single value is a list of one
        ("0-seed=1,lr=0.1", {"seed": 1, "lr": 0.1}), ("1-seed=0,lr=0.1", {"seed": 0, "lr": 0.1})]
    assert points_of({"points": [{"amp": "bf16", "pin_memory": False}, {}]}) == [
        ("0-amp=bf16,pin_memory=false", {"amp": "bf16", "pin_memory": False}), ("1", {})]


def test_flags_win_over_the_section() -> None:
    data = {"name": "file", "grid": {"lr": [1, 2], "seed": [0]}, "points": [{"lr": 9}], "max_parallel": 3,
            "run_dir": "base"}
    flags = {"grid": dict([parse_grid_flag("seed=5,6"), parse_grid_flag("amp=off")]),
             "points": [parse_point_flag("lr=0.5,seed=1")], "name": "flag", "max_parallel": 1, "run_dir": None}
    sweep = section(data, SPEC, flags)
    assert (sweep.name, sweep.max_parallel, sweep.sweep_dir) == ("flag", 1, Path("base/flag").absolute())
    assert dict(sweep.grid) == {"lr": (1, 2), "seed": (5, 6), "amp": ("off",)}
    assert sweep.points == ({"lr": 0.5, "seed": 1},)
    plain = section(None, SPEC)
    assert (plain.name, plain.max_parallel, plain.run_dir, plain.sweep_dir) == (
        "train", None, Path("runs"), Path("runs/train").absolute())
    assert section({"run_dir": "base"}, SPEC, {"run_dir": Path("/sweeps")}).sweep_dir == Path("/sweeps/train")
    assert section({"run_dir": ""}, SPEC).run_dir == Path("runs")  # empty: the default


def test_flag_values_are_numbers_only_when_they_read_back_as_given() -> None:
    assert [flag_value(t) for t in ("0.001", "3", "true", "1e-3", "007", "x", "", "[1]", "0.10")] == [
        0.001, 3, True, "1e-3", "007", "x", "", "[1]", "0.10"]
    with pytest.raises(ConfigError, match=r"--grid 'lr' is not KEY=V1,V2,.*HINT: e.g. --grid lr=0.001,0.0003"):
        parse_grid_flag("lr")
    with pytest.raises(ConfigError, match=r"--point 'lr=1,seed': 'seed' is not KEY=VALUE"):
        parse_point_flag("lr=1,seed")


@pytest.mark.parametrize(("data", "message"), [
    ({"gird": {}}, r"unknown key\(s\) in sweep: gird. HINT: valid keys are name, grid, points"),
    ({"grid": [1, 2]}, r"sweep.grid=\[1, 2\] is not a mapping"),
    ({"grid": {"lr": []}}, r"sweep.grid.lr has no values"),
    ({"grid": {"lr": [1, 2, 1]}}, r"sweep.grid.lr=\[1, 2, 1\] lists a value twice"),
    ({"grid": {"lr": [[1]]}}, r"sweep value lr=\[1\] is not a number, a word or true/false"),
    ({"grid": {"lr": [float("nan")]}}, r"sweep value lr=nan is not a number"),
    ({"grid": {"a b": [1]}}, r"sweep key 'a b' is not a setting name"),
    ({"points": {"lr": 1}}, r"sweep.points=\{'lr': 1\} is not a list of mappings"),
    ({"points": [{"note": "a\nb"}]}, r"sweep value note='a\\nb' holds a line break"),
    ({"max_parallel": 0, "grid": {"lr": [1]}}, r"max_parallel=0 must be at least 1"),
    ({"max_parallel": True}, r"max_parallel=True is not a whole number"),
    ({"name": "a/b"}, r"sweep name 'a/b' is not a folder name"),
    ({"name": ".."}, r"sweep name '..' is not a folder name"),
    ({"extra_keys": "samples"}, r"sweep.extra_keys='samples' is not a list of names"),
    ({"run_dir": 3}, r"sweep.run_dir=3 is not a folder"),
    ("lr", r"sweep: holds 'lr', expected a mapping"),
])
def test_a_bad_section_is_refused(data: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        expand(section(data, SPEC))


def test_points_given_as_flags_are_checked_as_the_files_are() -> None:
    with pytest.raises(ConfigError) as info:
        section(None, SPEC, {"points": [parse_point_flag("lr=1"), parse_point_flag("my key=1")]})
    assert (info.value.message, info.value.hint) == ("sweep key 'my key' is not a setting name.",
                                                     "use letters, digits and _ (e.g. lr).")
    with pytest.raises(ConfigError) as info:
        section({"points": [{"lr": 1}]}, SPEC, {"points": [parse_point_flag("note=a\nb")]})
    assert info.value.message == "sweep value note='a\\nb' holds a line break."


def test_no_points_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"the sweep has no points.*HINT: give --grid lr=0.001,0.0003"):
        expand(section({}, SPEC))


def test_point_names_are_path_safe_and_bounded() -> None:
    assert point_dir(3, {"data_dir": "/data/my set", "tag": "it's;$(rm -rf ~)", "x": "été"}) == \
        "3-data_dir=_data_my_set,tag=it_s___rm_-rf___,x=_t_"
    assert point_dir(0, {"lr": 1e-05, "flag": None, "amp": True}) == "0-lr=1e-05,flag=null,amp=true"
    long_a, long_b = point_dir(12, {"fsdp_wrap": "A" * 200}), point_dir(12, {"fsdp_wrap": "A" * 199 + "B"})
    assert len(long_a) == len(long_b) == MAX_DIR_CHARS and long_a != long_b
    assert long_a.startswith("12-fsdp_wrap=AAAA") and long_a[-11] == "-"
    assert point_dir(12, {"fsdp_wrap": "A" * 200}) == long_a  # the same point, the same name


def test_a_point_passes_its_settings_then_its_run_dir(tmp_path: Path) -> None:
    sweep = Sweep("s", {"lr": (0.001,)}, ({"tag": "a b"},), run_dir=tmp_path)
    first, second = expand(sweep)
    assert point_args(sweep, first) == ["lr=0.001", f"run_dir={tmp_path}/s/0-lr=0.001"]
    assert point_args(sweep, second) == ["tag=a b", f"run_dir={tmp_path}/s/1-tag=a_b"]


def checked(data: dict[str, Any], spec: JobSpec = SPEC) -> None:
    sweep = section(data, spec)
    check(spec, sweep, expand(sweep), settings_check(spec.args))


def test_a_typo_in_point_7_is_refused_naming_the_point() -> None:
    points = [{"lr": 0.1 * (i + 1)} for i in range(7)] + [{"lr": 0.01, "epoks": 3}]
    with pytest.raises(ConfigError) as refused:
        checked({"points": points})
    assert refused.value.message == "point 7 (lr=0.01, epoks=3): unknown key(s) in its settings: epoks."
    assert "did you mean epoks -> epochs?" in str(refused.value.hint)
    assert "list it in the sweep: section's extra_keys" in str(refused.value.hint)


def test_every_point_with_a_bad_value_is_named() -> None:
    with pytest.raises(ConfigError) as refused:
        checked({"grid": {"lr": [0.1, -1.0], "amp": ["bf16", "fp32"]}})
    assert [p.message.split(":")[0] for p in refused.value.problems] == [
        "point 1 (lr=0.1, amp=fp32)", "point 2 (lr=-1.0, amp=bf16)", "point 3 (lr=-1.0, amp=fp32)"]
    assert "lr=-1.0, expected a positive number" in refused.value.problems[1].message


def test_a_point_is_checked_with_the_specs_own_settings() -> None:
    """model=gpt alone contradicts the default dataset; with the spec's dataset=text it is right."""
    checked({"points": [{"model": "gpt"}]}, JobSpec(script="t.py", args=("dataset=text", "--flag")))
    with pytest.raises(ConfigError, match=r"point 0 \(model=gpt\): model=gpt is a language model"):
        checked({"points": [{"model": "gpt"}]})


def test_the_scripts_own_keys_are_passed_on_unchecked() -> None:
    checked({"grid": {"samples": [100, 200], "lr": [0.1]}, "extra_keys": ["samples"]})


@pytest.mark.parametrize(("data", "spec", "message"), [
    ({"grid": {"nodes": [1, 2]}}, SPEC, r"nodes is swept, but it is a job spec field: one job array has one set"),
    ({"points": [{"time": "5"}]}, SPEC, r"time is swept, but it is a job spec field"),
    ({"grid": {"python": ["a", "b"]}, "extra_keys": ["python"]}, SPEC, r"python is swept"),
    ({"grid": {"run_dir": ["a", "b"]}}, SPEC, r"run_dir is swept; every point gets a run_dir of its own"),
    ({"points": [{"run-dir": "a"}]}, SPEC, r"run_dir is swept"),
    ({"grid": {"lr": [1]}}, JobSpec(script="t.py", args=("run_dir=out",)), r"args hold 'run_dir=out'; a sweep"),
    ({"grid": {"lr": [1]}}, JobSpec(script="t.py", array="0-3"), r"array=0-3: a sweep makes its own array"),
    ({"grid": {"lr": [1.5]}, "points": [{"lr": 1.5}]}, SPEC, r"point 1 \(lr=1.5\) repeats point 0"),
])
def test_what_one_array_cannot_do_is_refused(data: dict[str, Any], spec: JobSpec, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        checked(data, spec)


def test_lr_and_batch_size_are_the_trainers_settings_not_resources() -> None:
    checked({"grid": {"lr": [0.1, 0.01], "batch_size": [16, 32]}})


RERUN_HINT = ("running a sweep again resubmits what has not completed, with the same points: give the grid and "
              "points it was started with, or a new --sweep-name for a new sweep.")


@pytest.mark.parametrize(("was", "now", "differ"), [
    ([1, 2], [1, 3], 1),
    ([1, 2], [5, 2], 0),
    ([1, 2], [1, 2, 3], 2),  # one more point: they differ from the first point the old sweep lacks
    ([1, 2, 3], [1, 2], 2),
    ([1, 2], [1, "2"], 1),  # the same folder name, another value
])
def test_a_rerun_must_have_the_points_the_sweep_started_with(tmp_path: Path, was: list[Any], now: list[Any],
                                                             differ: int) -> None:
    old = Manifest("s", tmp_path, tuple(expand(section({"points": [{"lr": v} for v in was]}, SPEC))))
    assert same_points(old, expand(section({"points": [{"lr": v} for v in was]}, SPEC))) is None
    changed = same_points(old, expand(section({"points": [{"lr": v} for v in now]}, SPEC)))
    assert changed is not None and (changed.message, changed.hint) == (
        f"{tmp_path}/sweep.json lists {len(was)} point(s), this sweep has {len(now)}; they differ from point "
        f"{differ} on.", RERUN_HINT)
