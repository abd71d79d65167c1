"""Settings files: YAML read with YAML 1.2's numbers and no dates, so values mean what users wrote
and Slurm times keep their meaning."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from torchslurm.configfile import MAX_FILE_BYTES, load_yaml, read_mapping, unknown_keys_error
from torchslurm.errors import ConfigError
from torchslurm.jobs import spec as jobspec
from torchslurm.jobs.sbatch import render
from torchslurm.train import config as trainconfig


@pytest.mark.parametrize(("value", "seconds"), [("1:00:00", 3600), ("30:00", 1800), ("1-12:00:00", 129600)])
def test_an_unquoted_time_in_a_yaml_job_spec_is_the_slurm_time_written(tmp_path: Path, value: str,
                                                                       seconds: int) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(f"script: train.py\ntime: {value}\n")
    spec = jobspec.load(path)
    assert spec.time == value and jobspec.parse_time(spec.time) == seconds
    assert f"#SBATCH --time={value}\n" in render(spec)


def test_other_yaml_scalars_are_read_as_yaml_reads_them() -> None:
    text = "a: 12\nb: 0.5\nc: 1_000\nd: 0x10\ne: -3\nf: .inf\ng: true\nh: 1.5e+3\ni: null\nj: '7'\nk: 1:2\n"
    assert load_yaml(text) == {"a": 12, "b": 0.5, "c": 1000, "d": 16, "e": -3, "f": float("inf"), "g": True,
                               "h": 1500.0, "i": None, "j": "7", "k": "1:2"}


@pytest.mark.parametrize(("text", "value"), [
    ("3e-4", 0.0003), ("1e3", 1000.0), ("-2.5E-2", -0.025), (".5", 0.5), ("1.", 1.0),  # 1.1: 3e-4 was text
    ("010", 10), ("007", 7),                                                       # 1.1: octal 8 and 7
    ("0o17", 15), ("0x1F", 31), ("+5", 5), ("-.INF", float("-inf")),
    ("2024-01-01", "2024-01-01"), ("2024-01-01 10:00:00", "2024-01-01 10:00:00"),  # 1.1: a date
    ("1:00:00", "1:00:00"), ("99:99", "99:99"), ("0b101", "0b101"),                # no base 60, no 0b
])
def test_yaml_scalars_follow_yaml_1_2_numbers_and_no_dates(text: str, value: object) -> None:
    loaded = load_yaml(f"v: {text}\n")["v"]
    assert loaded == value and type(loaded) is type(value)


def test_a_training_config_file_and_key_value_overrides_read_numbers_as_written(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text("lr: 3e-4\nseed: 010\nrun_dir: 2024-01-01\n")
    _, cfg = trainconfig.load(path, ["grad_clip=1e-1"])
    assert (cfg.lr, cfg.seed, str(cfg.run_dir), cfg.grad_clip) == (0.0003, 10, "2024-01-01", 0.1)
    _, cfg = trainconfig.load(path, ["lr=1e-3", "seed=010"])
    assert (cfg.lr, cfg.seed) == (0.001, 10)


def test_a_job_spec_name_that_looks_like_a_date_stays_the_name(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("script: train.py\nname: 2024-01-01\n")
    assert jobspec.load(path).name == "2024-01-01"


# -- hostile files: every one a ConfigError with a HINT, bounded in time and memory --------------------

def _alias_bomb(key: str, levels: int = 8) -> str:
    """A few hundred bytes whose last list stands for 9**levels strings once its aliases are expanded."""
    items = ["&a0 [" + ",".join(['"lol"'] * 9) + "]"]
    items += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return f"{key}: [{', '.join(items)}]\n"


@pytest.mark.parametrize(("key", "load"), [("nodes", lambda p: jobspec.load(p)), ("epochs", trainconfig.load)])
def test_a_yaml_alias_bomb_is_refused_with_a_short_message(tmp_path: Path, key: str, load: Any) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(("script: t.py\n" if key == "nodes" else "") + _alias_bomb(key))
    assert path.stat().st_size < 400  # 43 million strings once expanded
    with pytest.raises(ConfigError, match=r"bomb.yaml holds more than 10000 values \(an alias \*name counts as "
                       r"all the values it repeats\).*HINT: write the values out") as info:
        load(path)
    assert len(str(info.value)) < 1000


def test_an_alias_that_repeats_a_small_value_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("script: &s train.py\nargs: [*s, *s]\noutput: &o run.out\nerror: *o\n")
    spec = jobspec.load(path)
    assert (spec.args, spec.error) == (("train.py", "train.py"), "run.out")


def test_a_list_that_contains_itself_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"contains itself.*HINT: an alias may only repeat"):
        load_yaml("args: &a [1, *a]\n")


def test_a_file_that_is_not_utf8_is_refused_naming_the_byte_and_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"script: train.py\nname: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"^job spec .*job.yaml is not UTF-8 text: byte 0xe9 at line 2 .*"
                       r"HINT: save the file as UTF-8"):
        jobspec.load(path)


@pytest.mark.parametrize(("name", "text"), [
    ("job.yaml", "script: t.py\nargs: " + "[" * 5000 + "\n"),
    ("job.toml", "script = 't.py'\nargs = " + "[" * 5000 + "\n"),
    ("job.json", '{"script": "t.py", "args": ' + "[" * 5000 + "}"),
    ("job.toml", "script = 't.py'\nargs = " + "[" * 40 + "]" * 40 + "\n"),  # tomllib reads this; too deep still
])
def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"nests (lists or mappings|arrays or tables) more than 32 deep.*HINT"):
        jobspec.load(path)


@pytest.mark.parametrize(("name", "text", "digits"), [
    ("job.yaml", "script: t.py\nnodes: " + "9" * 5001 + "\n", r"5001 digits \(line 2, column 8\)"),
    ("job.yaml", "script: t.py\nnodes: 0x" + "f" * 5001 + "\n", r"5001 digits \(line 2, column 8\)"),
    ("job.toml", "script = 't.py'\nnodes = " + "9" * 5001 + "\n", "more than 4300 digits"),
    ("job.toml", "script = 't.py'\nnodes = 0x" + "f" * 5001 + "\n", r"about \d{4} digits"),
])
def test_an_integer_of_thousands_of_digits_is_refused(tmp_path: Path, name: str, text: str, digits: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"holds an integer of {digits}; no setting takes more than 100\. "
                       r"HINT: write a smaller number, or quote it if it is text\."):
        jobspec.load(path)


@pytest.mark.parametrize("item", ["epochs=" + "9" * 5001, "lr=" + "[" * 5000, "seed=" + "1" * 101])
def test_a_huge_key_value_override_is_refused(item: str) -> None:
    with pytest.raises(ConfigError, match=rf"^the value of {item.split('=')[0]} (holds an integer|nests).*HINT"):
        trainconfig.load(None, [item])


@pytest.mark.parametrize(("name", "text", "twice"), [
    ("job.yaml", "script: a.py\nnodes: 1\nscript: b.py\n", r"gives the key 'script' twice \(line 1, column 1 and "
                                                            r"line 3, column 1\)"),
    ("job.json", '{"script": "a.py", "script": "b.py"}', r"gives the key 'script' twice"),
    ("job.yaml", "script: a.py\nenv: {A: 1, A: 2}\n", r"gives the key 'A' twice"),
    ("job.yaml", "script: a.py\ntasks-per-node: 1\ntasks_per_node: 2\n", r"gives 'tasks_per_node' twice \(spelled "
                                                                         r"with `-` and with `_`\)"),
])
def test_a_key_given_twice_is_refused_as_toml_refuses_it(tmp_path: Path, name: str, text: str, twice: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"{twice}.*HINT: keep one of them"):
        jobspec.load(path)


def test_a_yaml_merge_key_may_override_what_it_merges() -> None:
    assert load_yaml("base: &b {A: 1, B: 2}\nenv:\n  <<: *b\n  A: 3\n")["env"] == {"A": 3, "B": 2}


def test_a_file_past_the_size_limit_or_a_device_is_refused_not_read_to_the_end(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("script: t.py\n" + "#" * MAX_FILE_BYTES + "\n")
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")
    for path in (big, zero):
        with pytest.raises(ConfigError, match=rf"{path.name} is larger than 256 KiB.*HINT: check the path"):
            jobspec.load(path)



# -- the bounds exactly, and every refusal's whole text ---------------------------------------------------

def _read(tmp_path: Path, name: str, text: str) -> Any:
    path = tmp_path / name
    path.write_text(text)
    return read_mapping(path, f"job spec {name}", ["script", "nodes"])


def _refusal(tmp_path: Path, name: str, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        _read(tmp_path, name, text)
    return str(info.value)


_SIMPLER = ("HINT: write each setting as `key: value`, its value a plain value or a short list or mapping of "
            "them.")


@pytest.mark.parametrize("name", ["job.yaml", "job.toml"])
def test_values_nested_32_deep_load_and_33_deep_are_refused_in_yaml_and_toml_alike(tmp_path: Path, name: str) -> None:
    """The top-level mapping is one level, so 31 lists inside it make 32; a plain value in the innermost list
    adds no level, and an empty list counts as a level as a full one does."""
    key = "a = " if name.endswith(".toml") else "a: "
    for inner in ("1", ""):
        assert _read(tmp_path, name, key + "[" * 31 + inner + "]" * 31) == {"a": _nested(31, inner)}
        assert _refusal(tmp_path, name, key + "[" * 32 + inner + "]" * 32).startswith(
            f"job spec {name} nests lists or mappings more than 32 deep")


def _nested(levels: int, inner: str) -> object:
    value: list[object] = [int(inner)] if inner else []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_a_toml_file_of_10000_values_loads_and_one_more_is_refused(tmp_path: Path) -> None:
    """The top-level mapping, the key and the list count too: 3 + 9997 values."""
    assert len(_read(tmp_path, "job.toml", "a = [" + ",".join(["0"] * 9997) + "]")["a"]) == 9997
    assert _refusal(tmp_path, "job.toml", "a = [" + ",".join(["0"] * 9998) + "]") == (
        "job spec job.toml holds more than 10000 values (an alias *name counts as all the values it repeats); a "
        "settings file holds a few dozen. HINT: write the values out instead of repeating lists by aliases, and "
        "check that the path names a settings file.")


def test_an_integer_of_333_bits_loads_and_one_of_334_bits_is_refused_with_its_digits(tmp_path: Path) -> None:
    """A TOML integer's digits are estimated from its bits (tomllib reads it before it can be counted)."""
    assert _read(tmp_path, "job.toml", f"nodes = {2 ** 333 - 1}\n") == {"nodes": 2 ** 333 - 1}
    assert _refusal(tmp_path, "job.toml", f"nodes = {2 ** 333}\n") == (  # 101 digits
        "job spec job.toml holds an integer of about 101 digits; no setting takes more than 100. HINT: write a "
        "smaller number, or quote it if it is text.")


def test_a_list_that_contains_itself_is_refused_with_the_whole_text() -> None:
    with pytest.raises(ConfigError) as info:
        load_yaml("args: &a [1, *a]\n")
    assert str(info.value) == ("the YAML text holds a list or mapping that contains itself (an alias *name inside "
                               "its own &name). HINT: an alias may only repeat a value that is complete before it.")


def test_underscores_between_digits_and_yaml_nan_read_as_numbers() -> None:
    loaded = load_yaml("a: 1__000\nb: 1__000.5\nc: 1_\nd: .nan\ne: .NaN\nf: -.Inf\n")
    assert (loaded["a"], loaded["b"], loaded["c"], loaded["f"]) == (1000, 1000.5, 1, float("-inf"))
    assert math.isnan(loaded["d"]) and math.isnan(loaded["e"])


@pytest.mark.parametrize(("name", "text", "message"), [
    ("job.toml", "a = = 1\n", "job spec job.toml is not valid toml: Invalid value (at line 1, column 5)."),
    ("job.yaml", "a: [1", "job spec job.yaml is not valid yaml: while parsing a flow sequence\n"),
    ("job.yml", "a: [1", "job spec job.yml is not valid yml: while parsing"),
    ("job", "a: [1", "job spec job is not valid YAML: while parsing"),
])
def test_a_syntax_error_names_the_file_and_its_format(tmp_path: Path, name: str, text: str, message: str) -> None:
    refusal = _refusal(tmp_path, name, text)
    assert refusal.startswith(message) and refusal.endswith(". HINT: fix the syntax at the position shown.")


def test_a_file_that_holds_no_mapping_is_refused_naming_the_valid_keys(tmp_path: Path) -> None:
    assert _refusal(tmp_path, "job.yml", "- 1\n- 2\n") == (
        "job spec job.yml holds a list, expected a mapping. HINT: write `key: value` lines; valid keys: script, "
        "nodes.")


def test_a_missing_file_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        read_mapping(tmp_path / "nope.yaml", "job spec nope.yaml", ["script"])
    assert str(info.value) == "cannot read job spec nope.yaml: No such file or directory. HINT: check the path."


def test_a_file_of_exactly_the_size_limit_loads_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    text = "script: t.py\n" + "#" * (MAX_FILE_BYTES - len("script: t.py\n"))
    assert _read(tmp_path, "job.yaml", text) == {"script": "t.py"}
    assert _refusal(tmp_path, "job.yaml", text + "#") == (
        "job spec job.yaml is larger than 256 KiB; a settings file is a few lines of YAML or TOML. HINT: check the "
        "path: it should name a YAML or TOML settings file.")


@pytest.mark.parametrize(("data", "line"), [(b"name: caf\xe9\nb: 1\nc: 2\n", 1), (b"\n\nname: caf\xe9\nb: 1\n", 3)])
def test_the_line_of_a_byte_that_is_not_utf8_counts_the_newlines_before_it(tmp_path: Path, data: bytes,
                                                                           line: int) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        read_mapping(path, "job spec job.yaml", ["name"])
    assert str(info.value) == (f"job spec job.yaml is not UTF-8 text: byte 0xe9 at line {line} is not part of a "
                               "UTF-8 character. HINT: save the file as UTF-8 (or check that the path names a YAML "
                               "or TOML settings file).")


def test_unknown_keys_are_named_with_a_guess_for_each_typo() -> None:
    error = unknown_keys_error("job spec x.yaml", ["scirpt", "__nodes", "zzz"], ["script", "nodes", "time"])
    assert (error.message, error.hint) == (
        "unknown key(s) in job spec x.yaml: scirpt, __nodes, zzz.",
        "did you mean scirpt -> script, __nodes -> nodes? a file's keys have no leading -- (tasks_per_node: 2 or "
        "tasks-per-node: 2); valid keys are script, nodes, time.")
    error = unknown_keys_error("TrainConfig(...)", ["zzz"], ["lr", "seed"])
    assert (error.message, error.hint) == ("unknown key(s) in TrainConfig(...): zzz.", "valid keys are lr, seed.")
    # a key of the built-in examples given to TrainConfig: no far-fetched guess (it used to be hang_action)
    error = unknown_keys_error("TrainConfig(...)", ["val_fraction", "epoks"], ["epochs", "hang_action"])
    assert error.hint == "did you mean epoks -> epochs? valid keys are epochs, hang_action."


def test_unknown_keys_past_twenty_are_counted_not_named() -> None:
    many = [f"k{i}" for i in range(20)]
    error = unknown_keys_error("job spec x.yaml", [*many, "scirpt", "extra"], ["script"])
    assert error.message == f"unknown key(s) in job spec x.yaml: {', '.join(many)}, and 2 more."
    assert error.hint == "valid keys are script."  # the typo past the twentieth is not guessed either
    assert unknown_keys_error("s", many, ["script"]).message == f"unknown key(s) in s: {', '.join(many)}."
    assert unknown_keys_error("s", [*many, "x"], ["script"]).message == (
        f"unknown key(s) in s: {', '.join(many)}, and 1 more.")


def test_an_unknown_key_is_shown_quoted_safely_and_guessed_from_its_first_100_characters() -> None:
    error = unknown_keys_error("s", ["scrip\n" + "t" * 500], ["script"])
    assert error.message.startswith("unknown key(s) in s: scrip\\n" + "t" * 10)
    assert error.hint == "valid keys are script."
    assert unknown_keys_error("s", ["_scipt"], ["script"]).hint == (
        "did you mean _scipt -> script? valid keys are script.")
    # a flag's spelling: the leading dashes (underscores once read) are not part of the guess
    assert unknown_keys_error("s", ["____lr"], ["lr", "seed"]).hint.startswith("did you mean ____lr -> lr? ")
    assert unknown_keys_error("s", ["XXXXlr"], ["lr", "seed"]).hint == "valid keys are lr, seed."  # only `_`
    # the guess compares at most the first 100 characters (difflib takes time quadratic in the length)
    long, longer = "x" * 100, "x" * 100 + "y"
    assert unknown_keys_error("s", [longer], [longer, long]).hint.startswith(f"did you mean {longer} -> {long}? ")
