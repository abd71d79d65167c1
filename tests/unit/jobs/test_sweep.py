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
    table,
)
from torchslurm.jobs.sweepstate import Manifest, PointState

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
    assert section({"name": ""}, SPEC, {"name": ""}).name == "train"


def test_flag_values_are_numbers_only_when_they_read_back_as_given() -> None:
    assert [flag_value(t) for t in ("0.001", "3", "true", "1e-3", "007", "x", "", "[1]", "0.10")] == [
        0.001, 3, True, "1e-3", "007", "x", "", "[1]", "0.10"]


def test_a_flag_splits_at_its_first_equals_sign() -> None:
    assert parse_grid_flag("tag=a=b,c") == ("tag", ["a=b", "c"])
    assert parse_grid_flag(" seed = 1, 2") == ("seed", [1, 2])
    assert parse_point_flag("tag=a=b,lr=0.5") == {"tag": "a=b", "lr": 0.5}


@pytest.mark.parametrize("item", ["lr", "lr=", "=1", ""])
def test_a_grid_flag_without_a_key_or_values_is_refused(item: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_grid_flag(item)
    assert (info.value.message, info.value.hint) == (f"--grid {item!r} is not KEY=V1,V2,....",
                                                     "e.g. --grid lr=0.001,0.0003 --grid seed=0,1.")


@pytest.mark.parametrize(("item", "part"), [("lr=1,seed", "seed"), ("=1", "=1"), ("lr=1, =2", " =2"), ("", "")])
def test_a_point_flag_with_a_part_that_is_not_key_value_is_refused(item: str, part: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_point_flag(item)
    assert (info.value.message, info.value.hint) == (f"--point {item!r}: {part!r} is not KEY=VALUE.",
                                                     "e.g. --point lr=0.01,seed=7.")


GRID_HINT = "write grid: {lr: [0.001, 0.0003], seed: [0, 1]}."
POINTS_HINT = "write points: [{lr: 0.01, seed: 7}, {lr: 0.1}]."
NAME_MESSAGE = "is not a folder name of letters, digits and . _ + -."
NAME_HINT = "give --sweep-name lr-seed (or name: in the sweep: section)."
SCALAR_HINT = "a point passes lr=VALUE to the script: give a scalar, e.g. lr: 0.1."


@pytest.mark.parametrize(("data", "message", "hint"), [
    ({"gird": {}, "point": []}, "unknown key(s) in sweep: gird, point.",
     "valid keys are name, grid, points, max_parallel, run_dir, extra_keys."),
    ({"grid": [1, 2]}, "sweep.grid=[1, 2] is not a mapping of keys to lists of values.", GRID_HINT),
    ({"grid": {"lr": []}}, "sweep.grid.lr has no values.", "give at least one: lr: [1, 2]."),
    ({"grid": {"seed": ()}}, "sweep.grid.seed has no values.", "give at least one: seed: [1, 2]."),
    ({"grid": {"lr": [1, 2, 1]}}, "sweep.grid.lr=[1, 2, 1] lists a value twice.", "give each value once."),
    ({"grid": {"amp": [True, "true"]}}, "sweep.grid.amp=[True, 'true'] lists a value twice.",  # the same lr=true
     "give each value once."),
    ({"grid": {"lr": [[1]]}}, "sweep value lr=[1] is not a number, a word or true/false.", SCALAR_HINT),
    ({"grid": {"lr": [float("nan")]}}, "sweep value lr=nan is not a number, a word or true/false.", SCALAR_HINT),
    ({"points": [{"lr": float("-inf")}]}, "sweep value lr=-inf is not a number, a word or true/false.",
     SCALAR_HINT),
    ({"grid": {"a b": [1]}}, "sweep key 'a b' is not a setting name.", "use letters, digits and _ (e.g. lr)."),
    ({"points": [{"1lr": 1}]}, "sweep key '1lr' is not a setting name.", "use letters, digits and _ (e.g. lr)."),
    ({"points": {"lr": 1}}, "sweep.points={'lr': 1} is not a list of mappings.", POINTS_HINT),
    ({"points": {}}, "sweep.points={} is not a list of mappings.", POINTS_HINT),
    ({"points": [{"lr": 1}, 2]}, "sweep.points=[{'lr': 1}, 2] is not a list of mappings.", POINTS_HINT),
    ({"points": [{"note": "a\nb"}]}, "sweep value note='a\\nb' holds a line break.", "give it on one line."),
    ({"points": [{"note": "a\rb"}]}, "sweep value note='a\\rb' holds a line break.", "give it on one line."),
    ({"points": [{"note": "a\0b"}]}, "sweep value note='a\\x00b' holds a line break.", "give it on one line."),
    ({"max_parallel": 0, "grid": {"lr": [1]}}, "max_parallel=0 must be at least 1.",
     "leave it out to let Slurm run every task at once."),
    ({"max_parallel": True}, "max_parallel=True is not a whole number.", "e.g. --max-parallel 4."),
    ({"max_parallel": 2.0}, "max_parallel=2.0 is not a whole number.", "e.g. --max-parallel 4."),
    ({"name": "a/b"}, f"sweep name 'a/b' {NAME_MESSAGE}", NAME_HINT),
    ({"name": ".."}, f"sweep name '..' {NAME_MESSAGE}", NAME_HINT),
    ({"name": "."}, f"sweep name '.' {NAME_MESSAGE}", NAME_HINT),
    ({"name": 3}, f"sweep name 3 {NAME_MESSAGE}", NAME_HINT),
    ({"extra_keys": "samples"}, "sweep.extra_keys='samples' is not a list of names.",
     "write extra_keys: [samples, step_sleep] (your script's own key=value arguments)."),
    ({"extra_keys": ["samples", 3]}, "sweep.extra_keys=['samples', 3] is not a list of names.",
     "write extra_keys: [samples, step_sleep] (your script's own key=value arguments)."),
    ({"run_dir": 3}, "sweep.run_dir=3 is not a folder.", "e.g. run_dir: runs (the default)."),
    ({"run_dir": 0}, "sweep.run_dir=0 is not a folder.", "e.g. run_dir: runs (the default)."),
    ({"run_dir": False}, "sweep.run_dir=False is not a folder.", "e.g. run_dir: runs (the default)."),
    ({"name": 0}, f"sweep name 0 {NAME_MESSAGE}", NAME_HINT),
    ({"name": False}, f"sweep name False {NAME_MESSAGE}", NAME_HINT),
    ("lr", "sweep: holds 'lr', expected a mapping.", "write sweep: {grid: {lr: [0.001, 0.0003]}, max_parallel: 2}."),
    ({}, "the sweep has no points: no grid and no explicit points.",
     "give --grid lr=0.001,0.0003 or --point lr=0.01, or a sweep: section with grid: or points:."),
])
def test_a_bad_section_is_refused(data: Any, message: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        expand(section(data, SPEC))
    assert (info.value.message, info.value.hint) == (message, hint)


def test_points_given_as_flags_are_checked_as_the_files_are() -> None:
    with pytest.raises(ConfigError) as info:
        section(None, SPEC, {"points": [parse_point_flag("lr=1"), parse_point_flag("my key=1")]})
    assert (info.value.message, info.value.hint) == ("sweep key 'my key' is not a setting name.",
                                                     "use letters, digits and _ (e.g. lr).")
    with pytest.raises(ConfigError) as info:
        section({"points": [{"lr": 1}]}, SPEC, {"points": [parse_point_flag("note=a\nb")]})
    assert info.value.message == "sweep value note='a\\nb' holds a line break."


def test_any_other_text_on_one_line_is_a_value() -> None:
    """Only a line break (or NUL) is refused in a word: X, tabs and blanks are the script's business."""
    assert points_of({"points": [{"tag": "X", "note": "a\tb c", "none": None}]}) == [
        ("0-tag=X,note=a_b_c,none=null", {"tag": "X", "note": "a\tb c", "none": None})]


def test_point_names_are_path_safe_and_bounded() -> None:
    assert point_dir(3, {"data_dir": "/data/my set", "tag": "it's;$(rm -rf ~)", "x": "été"}) == \
        "3-data_dir=_data_my_set,tag=it_s___rm_-rf___,x=_t_"
    assert point_dir(0, {"lr": 1e-05, "flag": None, "amp": True}) == "0-lr=1e-05,flag=null,amp=true"
    long_a, long_b = point_dir(12, {"fsdp_wrap": "A" * 200}), point_dir(12, {"fsdp_wrap": "A" * 199 + "B"})
    assert len(long_a) == len(long_b) == MAX_DIR_CHARS and long_a != long_b
    assert long_a.startswith("12-fsdp_wrap=AAAA") and long_a[-11] == "-"
    assert point_dir(12, {"fsdp_wrap": "A" * 200}) == long_a  # the same point, the same name


def test_a_point_name_of_max_dir_chars_is_kept_whole_one_more_is_cut() -> None:
    """`0-k=` and 76 letters make 80 characters; with 77 the name is cut to 69, `-` and a 10-digit hash."""
    assert point_dir(0, {"k": "a" * 76}) == "0-k=" + "a" * 76
    cut = point_dir(0, {"k": "a" * 77})
    assert len(cut) == MAX_DIR_CHARS and cut[:70] == "0-k=" + "a" * 65 + "-"
    assert all(c in "0123456789abcdef" for c in cut[70:])


def test_a_keys_unsafe_characters_are_made_underscores_too() -> None:
    assert point_dir(1, {"a b": 1, "c/d": "x"}) == "1-a_b=1,c_d=x"


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


ARRAY_REFUSED = ConfigError("array=0-3: a sweep makes its own array, one task per point.",
                            "drop --array (array: in the spec file); --max-parallel N limits how many run at once.")


def run_dir_refused(arg: str) -> ConfigError:
    return ConfigError(f"args hold {arg!r}; a sweep gives every point a run_dir of its own (<sweep dir>/<point>).",
                       "drop it; --sweep-dir (run_dir: in the sweep: section) sets the folder the sweep's folder "
                       "goes into.")


RUN_DIR_SWEPT = ConfigError("run_dir is swept; every point gets a run_dir of its own (<sweep dir>/<point>).",
                            "drop it from the grid and points; --sweep-dir sets where the sweep's folder goes.")


def resource_swept(key: str, flag: str) -> ConfigError:
    return ConfigError(f"{key} is swept, but it is a job spec field: one job array has one set of resources and one "
                       f"script.", f"submit one sweep per value of {key} (e.g. --sweep-name x-{key}1 {flag} 1).")


@pytest.mark.parametrize(("data", "spec", "expected"), [
    ({"grid": {"lr": [1]}}, JobSpec(script="t.py", array="0-3"), [ARRAY_REFUSED]),
    ({"grid": {"lr": [1]}}, JobSpec(script="t.py", args=("run-dir=out",)), [run_dir_refused("run-dir=out")]),
    ({"grid": {"lr": [1]}}, JobSpec(script="t.py", args=("run_dir=a=b",)), [run_dir_refused("run_dir=a=b")]),
    ({"grid": {"lr": [1]}}, JobSpec(script="t.py", args=("run_dir", "x=run_dir", "-run_dir", "--run_dirs=x",
                                                              "Xrun_dir=1")), []),
    ({"grid": {"lr": [1]}}, JobSpec(script="t.py", args=("--run_dir=x", "--run-dir", "x", "-run-dir=y")),
     [run_dir_refused("--run_dir=x"), run_dir_refused("--run-dir"), run_dir_refused("-run-dir=y")]),
    ({"grid": {"lr": [1]}}, JobSpec(script="t.py", array="0-3", args=("a=1", "run_dir=o")),
     [ARRAY_REFUSED, run_dir_refused("run_dir=o")]),
    ({"grid": {"run_dir": ["a", "b"]}}, SPEC, [RUN_DIR_SWEPT]),
    ({"points": [{"run-dir": "a"}]}, SPEC, [RUN_DIR_SWEPT]),
    ({"grid": {"gpus_per_node": [1, 2]}}, SPEC, [resource_swept("gpus_per_node", "--gpus-per-node")]),
    ({"grid": {"nodes": [1, 2], "lr": [1]}, "points": [{"time": "5", "nodes": 3}]}, SPEC,
     [resource_swept("nodes", "--nodes"), resource_swept("time", "--time")]),
])
def test_every_refusal_of_what_one_array_cannot_do_is_whole(data: dict[str, Any], spec: JobSpec,
                                                            expected: list[ConfigError]) -> None:
    sweep = section(data, spec)
    if not expected:
        check(spec, sweep, expand(sweep), None)
        return
    with pytest.raises(ConfigError) as info:
        check(spec, sweep, expand(sweep), None)
    assert [(p.message, p.hint) for p in info.value.problems] == [(e.message, e.hint) for e in expected]


def test_repeated_points_are_named_ten_at_most() -> None:
    """Twelve points alike: points 1 to 11 repeat point 0, and the error names the first ten."""
    sweep = section({"points": [{"lr": 1}] * 12}, SPEC)
    with pytest.raises(ConfigError) as info:
        check(SPEC, sweep, expand(sweep), None)
    assert [(p.message, p.hint) for p in info.value.problems] == [
        (f"point {i} (lr=1) repeats point 0.", "drop one of them (a grid value listed again as an explicit point?).")
        for i in range(1, 11)]
    assert info.value.message.startswith("10 invalid settings:\n  point 1 (lr=1) repeats point 0. HINT: drop")


def test_a_value_repeats_when_the_script_reads_the_same_text() -> None:
    sweep = section({"grid": {"amp": [True]}, "points": [{"amp": "true"}]}, SPEC)
    with pytest.raises(ConfigError) as info:
        check(SPEC, sweep, expand(sweep), None)
    assert info.value.message == "point 1 (amp=true) repeats point 0."


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


def test_the_table_shows_each_point_whether_it_is_submitted_its_state_settings_and_folder(tmp_path: Path) -> None:
    points = expand(section({"grid": {"lr": [0.5, 1]}, "points": [{"amp": True, "note": "a b"}]}, SPEC))
    old = Manifest("s", tmp_path, tuple(points))
    header = ["point", "submit", "state", "overrides", "run_dir"]
    assert table(old, None, [0, 2]) == [header, ["0", "yes", "new", "lr=0.5", "0-lr=0.5"],
                                        ["1", "", "new", "lr=1", "1-lr=1"],
                                        ["2", "yes", "new", "amp=true, note=a b", "2-amp=true,note=a_b"]]
    states = [PointState(0, "0-lr=0.5", {"lr": 0.5}, "completed"),
              PointState(1, "1-lr=1", {"lr": 1}, "failed", "exit code 1 on gpu07"),
              PointState(2, "2-amp=true,note=a_b", {"amp": True, "note": "a b"}, "pending", "Priority")]
    assert table(old, states, [1]) == [header, ["0", "", "completed", "lr=0.5", "0-lr=0.5"],
                                       ["1", "yes", "failed: exit code 1 on gpu07", "lr=1", "1-lr=1"],
                                       ["2", "", "pending: Priority", "amp=true, note=a b", "2-amp=true,note=a_b"]]
    assert table(Manifest("s", tmp_path, ()), None, []) == [header]
