"""Settings files: YAML read with YAML 1.2's numbers and no dates, so values mean what users wrote
and Slurm times keep their meaning."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchslurm.configfile import load_yaml
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
