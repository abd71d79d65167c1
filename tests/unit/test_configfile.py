"""Settings files: YAML read with YAML 1.2's numbers and no dates, so values mean what users wrote
and Slurm times keep their meaning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchslurm.configfile import MAX_FILE_BYTES, load_yaml
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

